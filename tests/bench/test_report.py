"""The bench report: a server without speculative counters reads n/a, and so does a draft
position no draft reached (sparkserve.bench.report)."""

from __future__ import annotations

import math
from pathlib import Path

from sparkserve.bench.report import WHICH_IS_WHICH, markdown, plot
from sparkserve.client import metrics
from sparkserve.output.plots import nan_for_none


def test_no_speculative_counters_means_n_a() -> None:
    plain = metrics.parse('vllm:prefix_cache_queries_total{model_name="m"} 5.0\n')
    acc = metrics.acceptance(plain, plain, "m")
    assert acc["mean_acceptance_length"] is None and acc["acceptance_per_position"] is None
    assert acc["drafts"] is None
    nothing = metrics.prefix_hit_rate({}, {}, "m")
    assert nothing == {"queries": None, "hits": None, "hit_rate": None}
    result = {
        "model": "m", "url": "http://127.0.0.1:1", "started_at": "now", "status": "DONE",
        "config": {"api": "chat", "gen_tokens": 8}, "ttft": None,
        "decode": [{
            "kind": "prose", "concurrency": 1, "per_stream_tok_s": 10.0,
            "aggregate_tok_s": 10.0, "ttft_s_mean": 0.1, "spec": acc,
            "prefix": metrics.prefix_hit_rate(plain, plain, "m"),
        }],
        "acceptance_by_kind": {"prose": acc},
        "overall": {"spec": acc, "prefix": nothing},
    }  # fmt: skip
    table = markdown(result)
    assert "| prose | 1 | 10.0 | n/a | n/a | n/a | 10.0 | 0.100 | n/a |" in table
    assert "mean acceptance length: n/a" in table


def test_a_position_no_draft_reached_is_n_a_in_the_table_and_a_gap_in_the_plot(
    tmp_path: Path,
) -> None:
    acc = {"drafts": 20.0, "draft_tokens": 40.0, "accepted": 30.0,
           "mean_acceptance_length": 2.5, "acceptance_per_position": [0.9, 0.5, None],
           "acceptance_per_position_of": "drafts that reached it"}  # fmt: skip
    result = {
        "model": "m", "url": "http://127.0.0.1:1", "started_at": "now", "status": "DONE",
        "config": {"api": "chat", "gen_tokens": 8}, "ttft": None,
        "decode": [{"kind": "code", "concurrency": 1, "per_stream_tok_s": 10.0,
                    "aggregate_tok_s": 10.0, "ttft_s_mean": 0.1, "spec": acc,
                    "prefix": {"queries": None, "hits": None, "hit_rate": None}}],
        "acceptance_by_kind": {"code": acc},
        "overall": {"spec": acc, "prefix": {"queries": None, "hits": None, "hit_rate": None}},
    }  # fmt: skip
    table = markdown(result)
    assert "(accepted at each draft position / drafts that reached it)" in table
    assert "| code | 20 | 30 | 2.50 | 90.0% | 50.0% | n/a |" in table
    assert nan_for_none([0.9, None])[0] == 0.9 and math.isnan(nan_for_none([0.9, None])[1])
    plot(result, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 0


def test_decode_steps_are_client_tokens_over_the_mean_accepted_length() -> None:
    accepting = {"drafts": 10.0, "mean_acceptance_length": 2.5}
    assert metrics.steps_per_s(30.0, accepting) == 12.0
    assert metrics.steps_per_s(30.0, {"drafts": None, "mean_acceptance_length": None}) == 30.0
    assert metrics.steps_per_s(30.0, {"drafts": 10.0, "mean_acceptance_length": None}) is None
    assert metrics.steps_per_s(None, accepting) is None
    row = {"kind": "code", "concurrency": 1, "per_stream_tok_s": 31.0,
           "client_per_stream_tok_s": 30.0, "decode_steps_s_per_stream": 12.0,
           "aggregate_tok_s": 30.0, "ttft_s_mean": 0.1,
           "spec": {**accepting, "accepted": 15.0, "acceptance_per_position": None},
           "prefix": {"queries": None, "hits": None, "hit_rate": None}}  # fmt: skip
    table = markdown({"model": "m", "url": "u", "started_at": "now", "status": "DONE",
                      "config": {"api": "chat", "gen_tokens": 8}, "ttft": None,
                      "decode": [row]})  # fmt: skip
    assert WHICH_IS_WHICH in table
    assert "| code | 1 | 31.0 | 30.0 | 12.0 | 2.50 | 30.0 | 0.100 | n/a |" in table
