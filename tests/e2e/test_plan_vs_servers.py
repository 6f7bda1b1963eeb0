"""`sparkserve plan`'s KV pool against the pools the run's two real vLLM CPU servers logged
(test_guard_under_pressure.py checks a third configuration)."""

from __future__ import annotations

import pytest

from support.cpu_launch import KV_CACHE_BYTES, SECOND_SERVER_KV_BYTES
from support.plan_check import cpu_plans, logged_pool
from support.vllm_server import VllmServer


@pytest.mark.e2e
def test_pool_matches_real_cpu_servers(
    shared_server: VllmServer,
    second_server: VllmServer,
    tiny_models: dict[str, str],
    cpu_venv_python: str,
) -> None:
    target, dflash = tiny_models["target"], tiny_models["dflash"]
    predicted = cpu_plans(
        cpu_venv_python,
        {
            "shared-dflash": {"target": target, "drafter": dflash, "method": "dflash", "n": 4,
                              "kv_bytes": KV_CACHE_BYTES, "prefix": True},
            "second-mtp": {"target": target, "method": "mtp", "n": 2,
                           "kv_bytes": SECOND_SERVER_KV_BYTES, "prefix": True},
        },
    )  # fmt: skip
    logged = {
        "shared-dflash": logged_pool(shared_server.log_path),
        "second-mtp": logged_pool(second_server.log_path),
    }
    print("pool predicted:", predicted, "logged:", logged)
    assert predicted == logged
