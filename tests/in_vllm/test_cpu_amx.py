"""The cpu-amx plugin: vLLM's own AMX attention kernel, in a fresh process of the CPU serving
venv, dies of SIGILL unless the process asked for AMX tile data; loaded the way vLLM loads it
(the `vllm.general_plugins` entry point of this checkout, installed), the plugin asks and the
kernel runs. Skipped on a CPU without AMX tiles, where vLLM never picks that kernel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

# vLLM's CPU attention as its backend calls it (cpu_attn.py), on a bf16 cache with 32-token
# blocks: the shape for which `_get_attn_isa` picks "amx"; nothing else runs before it.
AMX_ATTENTION = """
import json, sys, torch
from vllm import _custom_ops as ops
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
if sys.argv[1] == "plugins":
    from vllm.plugins import load_general_plugins
    load_general_plugins()
isa = _get_attn_isa(torch.bfloat16, 32, 128)
if isa != "amx":
    print(json.dumps({"isa": isa}))
    raise SystemExit
heads, kv_heads, dim, block, blocks, n = 4, 2, 128, 32, 4, 8
torch.manual_seed(0)
cache = torch.zeros(blocks, kv_heads, 2 * block, dim, dtype=torch.bfloat16)
key_cache, value_cache = cache.chunk(2, dim=2)
ops.cpu_attn_reshape_and_cache(
    torch.randn(n, kv_heads, dim, dtype=torch.bfloat16),
    torch.randn(n, kv_heads, dim, dtype=torch.bfloat16),
    key_cache, value_cache, torch.arange(n), isa)
starts, lengths = torch.tensor([0, n], dtype=torch.int32), torch.tensor([n], dtype=torch.int32)
query = torch.randn(n, heads, dim, dtype=torch.bfloat16)
out = torch.zeros_like(query)
ops.cpu_attention_with_kv_cache(
    query=query, key_cache=key_cache, value_cache=value_cache, output=out,
    query_start_loc=starts, seq_lens=lengths, scale=dim ** -0.5, causal=True,
    alibi_slopes=None, sliding_window=-1, block_table=torch.arange(blocks, dtype=torch.int32)[None],
    softcap=0.0, s_aux=None,
    scheduler_metadata=ops.cpu_attn_get_scheduler_metadata(
        1, heads, kv_heads, dim, lengths, torch.bfloat16, starts, True, -1, isa, False))
print(json.dumps({"isa": isa, "finite": bool(out.float().isfinite().all()),
                  "nonzero": bool(out.abs().sum() > 0)}))
"""


def attention_in_a_fresh_process(
    python: str, site: Path, plugins: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-c", AMX_ATTENTION, plugins], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, VLLM_TARGET_DEVICE="cpu", PYTHONPATH=str(site)),
    )  # fmt: skip


def test_vllms_amx_attention_needs_the_permission_and_the_plugin_requests_it(
    cpu_venv_python: str, sparkserve_site: Path
) -> None:
    bare = attention_in_a_fresh_process(cpu_venv_python, sparkserve_site, "none")
    if bare.returncode == 0 and json.loads(bare.stdout.splitlines()[-1])["isa"] != "amx":
        pytest.skip("no AMX tiles on this CPU: vLLM's CPU attention never takes its AMX kernel")
    # the bug, in vLLM's own kernel: a process that never asked is killed at the first tile op
    assert bare.returncode == -signal.SIGILL, (bare.returncode, bare.stderr[-2000:])
    loaded = attention_in_a_fresh_process(cpu_venv_python, sparkserve_site, "plugins")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    result = json.loads(loaded.stdout.splitlines()[-1])
    assert result == {"isa": "amx", "finite": True, "nonzero": True}, result
