"""The head tests run vLLM's own head classes from the test venv's vLLM, the CUDA build. On a CPU
with AMX, vLLM's CPU dispatch packs a bf16 head's weight with a kernel only its CPU build ships
(`torch.ops._C.convert_weight_packed`): these tests keep the dispatch a CPU without AMX takes, so
they exercise the same code on every machine."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def cpu_dispatch_without_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        from vllm.model_executor.layers import utils
    except ImportError:  # the tests that need vLLM skip themselves
        return
    monkeypatch.setattr(utils, "check_cpu_sgl_kernel", lambda n, k, dtype: False)
