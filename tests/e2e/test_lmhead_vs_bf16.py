"""The int8 lm-head plugin in a real vLLM CPU server: it runs in the engine's worker, and the
prompt log-probabilities match a server that kept the bf16 head."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from support.cpu_launch import MODEL_NAME
from support.vllm_server import VllmServer

VOCAB, HIDDEN = 4096, 128  # the tiny target's head (support/tiny_models.py)
PROMPTS = [
    "the server keeps a prefix cache of every block and " * 6,
    "def count(x, y):\n    return x + y\n" * 4,
]


def prompt_logprobs(server: VllmServer, prompt: str) -> dict[tuple[int, int], float]:
    """(position, token id) -> log-probability, for the prompt's own tokens."""
    reply = server.request(
        "/v1/completions",
        {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0,
         "prompt_logprobs": 0},
    )  # fmt: skip
    found: dict[tuple[int, int], float] = {}
    for position, entry in enumerate(reply["choices"][0]["prompt_logprobs"]):
        for token, info in (entry or {}).items():
            found[(position, int(token))] = float(info["logprob"])
    return found


@pytest.mark.e2e
def test_plugin_runs_in_the_worker_and_logits_match_the_bf16_server(
    shared_server: VllmServer, second_server: VllmServer
) -> None:
    """The shared server runs the int8 head; the second keeps the bf16 head (its speculative
    method differs, which prompt log-probabilities do not depend on)."""
    reports = list(Path(shared_server.env["SPARKSERVE_LMHEAD_REPORT"]).glob("lmhead-*.json"))
    assert len(reports) == 1, reports
    report = json.loads(reports[0].read_text())
    assert report["path"] == "int8" and report["bf16_released"]
    assert report["shape"] == [VOCAB, HIDDEN] and report["dtype"] == "torch.bfloat16"
    assert report["pid"] != shared_server.proc.pid, "must run in the engine's worker process"
    assert report["drafter"] == "shares the target's head (int8)"
    log = shared_server.log_path.read_text(errors="replace")
    assert "sparkserve int8 lm-head: active (4096x128, torch kernel, rows layout)" in log

    int8 = {prompt: prompt_logprobs(shared_server, prompt) for prompt in PROMPTS}
    bf16 = {prompt: prompt_logprobs(second_server, prompt) for prompt in PROMPTS}
    assert "kept the bf16 head: SPARK_KEEP_BF16_LMHEAD=1" in second_server.log_path.read_text()

    worst = 0.0
    for prompt in PROMPTS:
        common = int8[prompt].keys() & bf16[prompt].keys()
        assert len(common) >= 20, "too few positions to compare"
        worst = max(worst, *(abs(int8[prompt][k] - bf16[prompt][k]) for k in common))
    print(f"largest |logprob(int8) - logprob(bf16)| over the prompts: {worst:.4f}")
    # Tolerance: int8 row quantisation of a random head moves a logit by well under 1%;
    # a log-probability over a 4096-token vocabulary by at most a few hundredths.
    assert math.isfinite(worst) and worst < 0.05
