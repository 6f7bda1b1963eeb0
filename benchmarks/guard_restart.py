"""How fast the guard keeper answers a hung guard and a guard killed with SIGKILL: a new guard,
then a stop.

The keeper (`python -m sparkserve.guard.keeper`, as the launchers start it) guards a sleeping
process with the floor far under MemAvailable. Per run: the keeper's CPU over IDLE_S with a
healthy guard; the guard SIGSTOPped (hung: alive, taking no readings) and the time to the new
guard's first write of `watching 1`; then the guard killed with SIGKILL until the keeper's
restarts are spent (each time after the new guard wrote its state file) and the time from each
SIGKILL to the new guard's state; then one kill more, and the time from that SIGKILL to the
guarded process's exit (the keeper's stop); and the resident memory of the keeper and of a
guard. Standard library, psutil and sparkserve:

    PYTHONPATH=src python3 benchmarks/guard_restart.py --runs 3 --json guard-restart.json

Prints a table and writes JSON; exit 1 when a run did not end with the guarded process stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from bench_record import record_runs
from guard_cost import rss_mib

from sparkserve.guard.keeper import RESTARTS

COLUMNS = ("run", "hung_s", "restarts_s", "max_restart_s", "stop_s", "keeper_cpu_pct",
           "keeper_rss_mib", "guard_rss_mib", "load_1m")  # fmt: skip
SRC = Path(__file__).resolve().parents[1] / "src"
HANG_S = 60.0
IDLE_S = 20.0


def state_written(path: Path, since: float) -> float | None:
    """When the state file was written with `watching 1`, if after `since` (epoch seconds)."""
    with contextlib.suppress(OSError, ValueError):
        values = dict(
            line.split(" ", 1) for line in path.read_text().splitlines() if line[:1] != "#"
        )
        written = float(values["sparkserve_guard_updated_timestamp_seconds"])
        if written > since and float(values["sparkserve_guard_watching"]) == 1:
            return written
    return None


def wait_written(path: Path, since: float) -> float:
    deadline = time.monotonic() + HANG_S
    while (written := state_written(path, since)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no guard wrote {path} in {HANG_S:.0f} s")
        time.sleep(0.01)
    return written


def the_guard(keeper: psutil.Process, other_than: int) -> psutil.Process:
    (guard,) = [p for p in keeper.children() if p.pid != other_than]
    return guard


def run_once(number: int) -> dict[str, object]:
    sleeper = subprocess.Popen(["sleep", "600"])
    env = dict(os.environ, PYTHONPATH=str(SRC))
    with tempfile.TemporaryDirectory() as work:
        state = Path(work) / "guard.prom"
        keeper_proc = subprocess.Popen(
            [sys.executable, "-m", "sparkserve.guard.keeper", "--pid", str(sleeper.pid),
             "--floor-gb", "0.5", "--swap-mb-s", "0", "--textfile-dir", work],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_written(state, 0.0)
            keeper = psutil.Process(keeper_proc.pid)
            guard = the_guard(keeper, 0)
            keeper_rss, guard_rss = rss_mib(keeper.pid), rss_mib(guard.pid)
            before = sum(keeper.cpu_times()[:2])
            time.sleep(IDLE_S)
            keeper_cpu_pct = round(100 * (sum(keeper.cpu_times()[:2]) - before) / IDLE_S, 3)
            stopped_at = time.time()
            guard.send_signal(signal.SIGSTOP)
            hung_s = round(wait_written(state, stopped_at) - stopped_at, 3)
            guard = the_guard(keeper, guard.pid)
            restarts = []
            for _ in range(RESTARTS - 1):  # the hung guard was the first death
                killed = time.time()
                guard.send_signal(signal.SIGKILL)
                restarts.append(round(wait_written(state, killed) - killed, 3))
                guard = the_guard(keeper, guard.pid)
            killed = time.time()
            guard.send_signal(signal.SIGKILL)
            sleeper.wait(timeout=HANG_S)
            stop_s = round(time.time() - killed, 3)
            stopped = sleeper.returncode == -signal.SIGTERM
        finally:
            sleeper.kill()
            sleeper.wait()
            keeper_proc.kill()
            keeper_proc.wait()
    return {
        "run": number, "hung_s": hung_s, "restarts_s": ", ".join(f"{s:.2f}" for s in restarts),
        "max_restart_s": max(restarts), "stop_s": stop_s, "keeper_cpu_pct": keeper_cpu_pct,
        "keeper_rss_mib": keeper_rss,
        "guard_rss_mib": guard_rss, "load_1m": round(os.getloadavg()[0], 2),
        "stopped_by_sigterm": stopped,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the runs here")
    args = parser.parse_args(argv)
    runs = record_runs(
        "guard_restart", args, COLUMNS, (run_once(number) for number in range(1, args.runs + 1))
    )
    return 0 if all(run["stopped_by_sigterm"] for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
