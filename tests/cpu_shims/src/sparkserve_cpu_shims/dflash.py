"""Fix 2: DFlash context K/V through the per-layer projections on the CPU.

``DFlashQwen3Model._build_context_kv_buffers`` concatenates every layer's
``qkv_proj.weight[q_size:]`` into one fused weight, and ``_project_context_kv`` runs a
single ``F.linear`` over it. The CPU backend repacks unquantised linear weights for its
own GEMM and leaves ``layer.weight`` empty, so with dummy weights (buffers built after
packing) that GEMM fails with ``size mismatch ... vec (0)``. ``_project_context_kv``
already has a per-layer path (used for quantised layers) that calls each projection
through its linear method; clearing the fused weight selects it.
"""

from __future__ import annotations

import inspect
import logging
from types import ModuleType
from typing import Any

log = logging.getLogger("vllm.sparkserve_cpu_shims")


def patch(module: ModuleType) -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    model_cls: Any = module.DFlashQwen3Model
    original = model_cls._build_context_kv_buffers
    if getattr(original, "_sparkserve_shim", False):
        return
    build_src = inspect.getsource(original)
    project_src = inspect.getsource(model_cls._project_context_kv)
    if (
        "self._fused_kv_weight" not in build_src
        or "if self._fused_kv_weight is not None:" not in project_src
        or "proj(normed_context_states)" not in project_src
    ):
        raise RuntimeError(
            "sparkserve_cpu_shims: DFlash context-KV code is not the one fix 2 expects"
        )

    def build_without_fused_weight(self: Any, layers_attn: Any, has_bias: bool) -> None:
        original(self, layers_attn, has_bias)
        if self._fused_kv_weight is not None:
            self._fused_kv_weight = None
            self._fused_kv_bias = None
            log.info(
                "sparkserve_cpu_shims: fix 2: DFlash context K/V uses the per-layer "
                "projections (%d layers)",
                len(layers_attn),
            )

    build_without_fused_weight._sparkserve_shim = True  # type: ignore[attr-defined]
    model_cls._build_context_kv_buffers = build_without_fused_weight
    log.info("sparkserve_cpu_shims: fix 2 applied: %s patched", module.__name__)
