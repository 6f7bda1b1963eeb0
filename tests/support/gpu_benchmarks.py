"""benchmarks/gpu's scripts imported as modules for their CPU-testable parts, with their
sibling served.py importable as when they run as scripts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

GPU_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"


def load(name: str) -> ModuleType:
    if str(GPU_BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(GPU_BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, GPU_BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
