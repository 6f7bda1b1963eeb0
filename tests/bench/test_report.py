"""The bench report: a server without speculative counters reads n/a (sparkserve.bench.report)."""

from __future__ import annotations

from sparkserve.bench.report import markdown
from sparkserve.client import metrics


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
    assert "| prose | 1 | 10.0 | 10.0 | 0.100 | n/a | n/a |" in table
    assert "mean acceptance length: n/a" in table
