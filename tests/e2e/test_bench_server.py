"""`sparkserve bench` against the run's shared vLLM CPU server: what it reports equals what the
server counted; a wrong model fails before any load. `sparkserve llama-benchy` stopped by
Ctrl-C keeps what it measured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.client import metrics
from support.cpu_launch import cpu_python
from support.vllm_server import VllmServer

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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


@pytest.mark.e2e
def test_llama_benchy_stopped_by_ctrl_c_keeps_what_it_measured(
    shared_server: VllmServer, tmp_path: Path
) -> None:
    """`sparkserve llama-benchy` (the llama-benchy of the CPU serving venv's lock) at depth 0
    on the drafting server, Ctrl-C once its second test has begun: llama-benchy is stopped,
    the first test's row and counters are written, the second is marked cut short (its row too,
    where llama-benchy saved one before the interrupt landed), exit 130."""
    out = tmp_path / "benchy"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    tool = subprocess.Popen(
        [cpu_python(), "-m", "sparkserve", "llama-benchy", "--url", shared_server.base_url,
         "--profile", "short", "--depths", "0", "--concurrency", "1,2", "--runs", "3",
         "--corpus", "offline", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert tool.stderr is not None
    seen = []
    for line in tool.stderr:
        seen.append(line)
        if "Running test: pp=512, tg=32, depth=0, concurrency=2" in line:
            tool.send_signal(signal.SIGINT)
            break
    _, rest = tool.communicate(timeout=120)
    assert tool.returncode == 130, ("".join(seen) + rest)[-3000:]
    document = json.loads((out / "benchy.json").read_text())
    assert document["status"] == "INTERRUPTED"
    first, second = document["tests"]
    assert not first["cut_short"] and first["speculation"]["drafts"] > 0, first
    assert second["cut_short"] and second["concurrency"] == 2, second
    # the first test's row is kept whole; the interrupt may land before or after llama-benchy
    # saved the second test's row: if saved, it is kept and labelled cut short
    row, *late = document["rows"]
    assert row["concurrency"] == 1 and row["e2e_ttft"]["mean"] > 0 and not row["cut_short"]
    # llama-benchy times decoding between a stream's content chunks and leaves the figure out
    # when all tokens came in one; vLLM merges the deltas of a reader that falls behind
    # (`RequestOutputCollector.put`): CI's loaded 2-core run of 2026-12-06 got such a row
    assert row["tg_throughput"] is None or row["tg_throughput"]["mean"] > 0, row
    assert len(late) <= 1 and all(r["concurrency"] == 2 and r["cut_short"] for r in late), late
    assert "(cut short)" in (out / "benchy.md").read_text()
