"""What the memory guard costs while nothing happens: its share of one core and its memory.

The guard (`python -m sparkserve.guard.monitor`, default polling: 5 readings a second while
MemAvailable is steady) watches a sleeping process, with the floor far under MemAvailable so
that it never acts. Per run, after the interpreter's start: the CPU time the guard used over
`--seconds` (utime + stime from /proc/PID/stat) as a share of one core, and its VmRSS.
Standard library and sparkserve only:

    PYTHONPATH=src python3 benchmarks/guard_cost.py --runs 3 --json guard-cost.json

Prints a table and writes JSON; exit 1 when a guard exited before its run was over.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_record import record_runs

COLUMNS = ("run", "seconds", "cpu_share_pct", "vm_rss_mib", "load_1m")
SRC = Path(__file__).resolve().parents[1] / "src"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def run_once(number: int, seconds: float, settle_s: float) -> dict[str, object]:
    sleeper = subprocess.Popen(["sleep", str(int(seconds + settle_s + 30))])
    env = dict(os.environ, PYTHONPATH=str(SRC))
    with tempfile.TemporaryDirectory() as work:
        guard = subprocess.Popen(
            [sys.executable, "-m", "sparkserve.guard.monitor", "--pid", str(sleeper.pid),
             "--floor-gb", "0.5", "--swap-mb-s", "0", "--textfile-dir", work],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(settle_s)  # past the interpreter's start
            t0, c0 = time.monotonic(), cpu_seconds(guard.pid)
            time.sleep(seconds)
            share = (cpu_seconds(guard.pid) - c0) / (time.monotonic() - t0)
            rss = rss_mib(guard.pid)
            alive = guard.poll() is None
        finally:
            sleeper.kill()
            sleeper.wait()
            guard.kill()
            guard.wait()
    return {
        "run": number, "seconds": seconds, "cpu_share_pct": round(100 * share, 3),
        "vm_rss_mib": rss, "load_1m": round(os.getloadavg()[0], 2), "ran_throughout": alive,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="CPU time counted over this")
    parser.add_argument("--settle-s", type=float, default=1.5, help="wait after the start")
    parser.add_argument("--json", type=Path, help="write the runs here")
    args = parser.parse_args(argv)
    runs = record_runs(
        "guard_cost",
        args,
        COLUMNS,
        (run_once(number, args.seconds, args.settle_s) for number in range(1, args.runs + 1)),
    )
    return 0 if all(run["ran_throughout"] for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
