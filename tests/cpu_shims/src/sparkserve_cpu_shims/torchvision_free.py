"""Fix 1: import qwen3_5.py without torchvision.

vLLM's ``qwen3_vl.py`` (imported by ``qwen3_5.py`` even for the text-only model) does
``from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize``.
In transformers 5.x that module imports ``torchvision`` at its top. The CPU venv has no
torchvision (PyPI's wheels are CUDA builds that break ``import vllm`` here), so we put a
stand-in module under that name holding the PIL processor's ``smart_resize``, which
transformers marks "Copied from" the torchvision one; we check their code is the same.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import logging
import sys
import types
from pathlib import Path

log = logging.getLogger("vllm.sparkserve_cpu_shims")

TARGET = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
PIL_TWIN = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


def _function_ast(path: str, name: str) -> str:
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.dump(node, include_attributes=False)
    raise RuntimeError(f"sparkserve_cpu_shims: no top-level {name}() in {path}")


def install() -> None:
    if importlib.util.find_spec("torchvision") is not None:
        log.info("sparkserve_cpu_shims: torchvision is installed; fix 1 not needed")
        return
    if TARGET in sys.modules:
        return  # already imported (real or stand-in): nothing to do
    spec = importlib.util.find_spec(TARGET)
    twin_spec = importlib.util.find_spec(PIL_TWIN)
    if spec is None or spec.origin is None or twin_spec is None or twin_spec.origin is None:
        raise RuntimeError(f"sparkserve_cpu_shims: {TARGET} or {PIL_TWIN} not found")
    source = Path(spec.origin).read_text(encoding="utf-8")
    if "torchvision" not in source:
        raise RuntimeError(f"sparkserve_cpu_shims: {TARGET} no longer imports torchvision")
    if _function_ast(spec.origin, "smart_resize") != _function_ast(
        twin_spec.origin, "smart_resize"
    ):
        raise RuntimeError("sparkserve_cpu_shims: the two smart_resize() differ")

    twin = importlib.import_module(PIL_TWIN)
    stand_in = types.ModuleType(TARGET, "sparkserve_cpu_shims stand-in (no torchvision)")
    stand_in.smart_resize = twin.smart_resize  # type: ignore[attr-defined]
    # Same fallback transformers itself picks without torchvision.
    stand_in.Qwen2VLImageProcessor = twin.Qwen2VLImageProcessorPil  # type: ignore[attr-defined]
    sys.modules[TARGET] = stand_in
    log.info(
        "sparkserve_cpu_shims: fix 1 applied: %s served from %s (no torchvision)",
        TARGET,
        PIL_TWIN,
    )
