"""How long the pair watch takes from a failure to the surviving node's vLLM stopped.

Two real watches (`python -m sparkserve.cluster.watch`) on the loopback interface, each in
front of a stand-in for vLLM (a shell whose child sleeps, and which stops it on SIGTERM), as
tests/cluster/test_watch.py runs them. Per run and failure, the time from the failure to the
head's watch exiting after it stopped its node's stand-in:

- `vllm-killed`: the worker's stand-in is killed (the worker's watch sees it and says bye);
- `silent-peer`: the worker's watch is stopped (SIGSTOP: connected and silent, a cut link),
  which the head counts as lost after `--peer-timeout-s`.

docs/CLUSTER.md ("The bound") promises a bye in well under a second and silence in the peer
timeout plus up to one beat, then vLLM's exit. Needs the test support modules:

    PYTHONPATH=src:tests python3 benchmarks/watch_reaction.py --runs 3 --json watch.json

Prints a table and writes JSON; exit 1 when a head's watch did not stop its node.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_record import record_runs

from sparkserve.cluster.watch import EXIT_STOPPED
from support.vllm_server import LOOPBACK, free_port
from support.watches import wait_joined, watch_argv

COLUMNS = ("run", "failure", "peer_timeout_s", "to_head_stopped_s", "load_1m")
POLITE = "trap 'kill $!; exit 0' TERM; sleep 300 & wait"
FAILURES = ("vllm-killed", "silent-peer")


def run_once(
    number: int, failure: str, peer_timeout_s: float, grace_s: float, work: Path
) -> dict[str, object]:
    port = free_port()
    trees, watches = [], []
    for rank in (0, 1):
        tree = subprocess.Popen(["sh", "-c", POLITE], start_new_session=True)
        argv = watch_argv(
            tree.pid, rank, LOOPBACK, LOOPBACK, port, work / f"state-{number}-{rank}.json",
            peer_timeout_s=peer_timeout_s, join_timeout_s=60.0, grace_s=grace_s,
        )  # fmt: skip
        trees.append(tree)
        watches.append(subprocess.Popen(argv, stderr=subprocess.DEVNULL))
    head, worker = watches
    try:
        for rank in (0, 1):
            wait_joined(work / f"state-{number}-{rank}.json", [], 60.0)
        time.sleep(1.5)  # a beat from each side
        started = time.monotonic()
        if failure == "vllm-killed":
            os.killpg(trees[1].pid, signal.SIGKILL)
        else:
            worker.send_signal(signal.SIGSTOP)
        code = head.wait(timeout=120)
        took = time.monotonic() - started
    finally:
        worker.send_signal(signal.SIGCONT)
        for proc in (*watches, *trees):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return {
        "run": number, "failure": failure, "peer_timeout_s": peer_timeout_s,
        "to_head_stopped_s": round(took, 3), "load_1m": round(os.getloadavg()[0], 2),
        "head_exit": code,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--peer-timeout-s", type=float, default=2.0)
    parser.add_argument("--grace-s", type=float, default=1.0)
    parser.add_argument("--json", type=Path, help="write the runs here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        runs = record_runs(
            "watch_reaction",
            args,
            COLUMNS,
            (
                run_once(number, failure, args.peer_timeout_s, args.grace_s, Path(work))
                for number in range(1, args.runs + 1)
                for failure in FAILURES
            ),
        )
    return 0 if all(run["head_exit"] == EXIT_STOPPED for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
