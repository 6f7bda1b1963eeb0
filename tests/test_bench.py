"""sparkserve bench (scripts/bench.sh): the counter arithmetic, then a short run against the
shared DFlash server whose reported acceptance length and prefix-cache hit rate must equal
what the server's own counters say over the same window."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.bench.cli import parse_kinds
from sparkserve.bench.report import markdown
from sparkserve.client import metrics
from sparkserve.command_line import UsageError
from support.vllm_server import VllmServer

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

BEFORE = """
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="10"} 0.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_hits_total{engine="0",model_name="other"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 2.0
"""
AFTER = """
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 70.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 120.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 27.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 17.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="10"} 2.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 3000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1600.0
vllm:prefix_cache_hits_total{engine="0",model_name="other"} 900.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.5
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 5.0
"""


def test_acceptance_from_counter_deltas() -> None:
    acc = metrics.acceptance(metrics.parse(BEFORE), metrics.parse(AFTER), "m")
    assert acc["drafts"] == 20 and acc["accepted"] == 50 and acc["draft_tokens"] == 80
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 50 / 20)
    # Positions in numeric order (10 after 1), each accepted / drafts.
    assert acc["acceptance_per_position"] == pytest.approx([18 / 20, 10 / 20, 2 / 20])


def test_hit_rate_and_histogram_mean_from_deltas() -> None:
    before, after = metrics.parse(BEFORE), metrics.parse(AFTER)
    assert metrics.prefix_hit_rate(before, after, "m") == {
        "queries": 2000.0, "hits": 1500.0, "hit_rate": 0.75,
    }  # fmt: skip
    assert metrics.histogram_mean(
        before, after, "vllm:time_to_first_token_seconds", "m"
    ) == pytest.approx(0.5)
    assert metrics.histogram_mean(after, after, "vllm:time_to_first_token_seconds") is None


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


@pytest.mark.parametrize("text", ["", "poetry", "prose,prose", "code,"])
def test_bad_kinds(text: str) -> None:
    with pytest.raises(UsageError, match="must be some of prose,code,agent"):
        parse_kinds(text)


@pytest.mark.e2e
def test_bench_reports_what_the_server_counted(shared_server: VllmServer, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    before = shared_server.metrics()
    done = subprocess.run(
        [
            str(REPO / "scripts" / "bench.sh"), "--url", shared_server.base_url,
            "--out", str(out), "--concurrency", "1,2", "--gen-tokens", "24",
            "--prefix-tokens", "1200", "--ttft-rounds", "1",
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    after = shared_server.metrics()
    assert done.returncode == 0, done.stderr
    assert "[bench] 6/6 agent c=2" in done.stderr  # progress
    result = json.loads((out / "bench.json").read_text())
    assert (out / "bench.png").read_bytes()[:8] == PNG_MAGIC
    table = (out / "bench.md").read_text()
    assert table == done.stdout and "| agent | 2 |" in table

    drafts = metrics.delta(before, after, metrics.DRAFTS)
    accepted = metrics.delta(before, after, metrics.ACCEPTED)
    queries = metrics.delta(before, after, metrics.PREFIX_QUERIES)
    hits = metrics.delta(before, after, metrics.PREFIX_HITS)
    assert drafts and queries and hits is not None and accepted is not None
    overall = result["overall"]
    assert overall["spec"]["drafts"] == drafts
    assert overall["spec"]["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts)
    assert overall["prefix"]["hit_rate"] == pytest.approx(hits / queries)
    # The cells add up to the whole window, and per-position figures come from the counters.
    assert sum(c["spec"]["drafts"] for c in result["decode"]) <= drafts
    positions = metrics.by_label(after, metrics.ACCEPTED_PER_POS, "position")
    assert len(result["acceptance_by_kind"]["code"]["acceptance_per_position"]) == len(positions)

    ttft = result["ttft"]
    assert ttft["rounds"][0]["cold"]["prompt_tokens"] >= 1000
    assert ttft["rounds"][0]["warm"]["hits"] > 0  # the warm prompt reuses the cold one's KV
    assert ttft["cold_ttft_s"] > 0 and ttft["warm_ttft_s"] > 0
    cells = {(c["kind"], c["concurrency"]) for c in result["decode"]}
    assert cells == {(k, c) for k in ("prose", "code", "agent") for c in (1, 2)}
    for cell in result["decode"]:
        assert cell["completion_tokens"] == 24 * cell["concurrency"]
        assert cell["per_stream_tok_s"] > 0 and cell["aggregate_tok_s"] > 0
    print("observed:", json.dumps({"ttft": ttft, "overall": overall}))


@pytest.mark.e2e
def test_bench_wrong_model_fails_before_any_load(shared_server: VllmServer) -> None:
    before = metrics.total(shared_server.metrics(), metrics.PREFIX_QUERIES)
    done = subprocess.run(
        [sys.executable, "-m", "sparkserve", "bench", "--url", shared_server.base_url,
         "--model", "gpt-5"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().startswith("sparkserve bench: model 'gpt-5' is not served by")
    assert metrics.total(shared_server.metrics(), metrics.PREFIX_QUERIES) == before
