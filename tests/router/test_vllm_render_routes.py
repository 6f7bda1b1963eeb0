"""vLLM's render routes, which vllm-router's cache_aware asks each replica for a prompt's token
ids: vLLM answers them 403 unless `vllm serve` runs with --enable-scale-out (docs/CLUSTER.md, N
replicas: EXTRA_ARGS on each replica). The router takes a 403 as a refusal, not as a missing
route, so it does not fall back to /tokenize, and routes that request by load alone
(tests/router/test_router_replicas.py shows render used with the flag)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.release
RENDER = "/v1/chat/completions/render"
PROBE = """
import argparse, json
from fastapi import FastAPI
from fastapi.testclient import TestClient
from vllm.entrypoints.scale_out.factories import register_scale_out_api_routers
seen = {}
for flag in (False, True):
    app = FastAPI()
    app.state.args = argparse.Namespace(enable_scale_out=flag, tokens_only=False)
    register_scale_out_api_routers(app, ("generate",))
    paths = {route.path for route in app.routes}
    answer = TestClient(app).post("/v1/chat/completions/render", json={}) if not flag else None
    seen[str(flag)] = {"paths": sorted(paths), "status": answer and answer.status_code}
print(json.dumps(seen))
"""


def test_the_cpu_images_vllm_refuses_render_without_the_flag(cpu_venv_python: str) -> None:
    done = subprocess.run(
        [cpu_venv_python, "-c", PROBE], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["False"]["status"] == 403
    for flag in ("False", "True"):
        # the flag also opens token-in generation and its abort (behind the replica's key)
        assert {RENDER, "/v1/completions/render", "/inference/v1/generate"} <= set(
            seen[flag]["paths"]
        )


def test_the_spark_images_vllm_gates_render_on_the_same_flag() -> None:
    """The image's vLLM (the core venv's, versions.env VLLM_VERSION) imports only on a GPU
    machine's stack, so its source is read: the same switch and the same 403."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "entrypoints/scale_out/factories.py").read_text()
    assert 'getattr(args, "enable_scale_out", False)' in source
    assert "HTTPStatus.FORBIDDEN" in source and "disabled_scale_out" in source
