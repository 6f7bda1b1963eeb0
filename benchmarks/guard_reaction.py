"""How fast the memory guard stops a process that eats memory as fast as it can.

The watched process is itself the hog: it allocates and touches 8 MiB chunks, reads
MemAvailable after each (as the guard does: its cgroup's headroom where that is less), and
notes the first reading under the floor and when its SIGTERM handler runs. The guard
(`python -m sparkserve.guard.monitor`, default polling) watches it with the floor a few GiB under
MemAvailable at the start. Per run: the hog's rate, the lowest MemAvailable against the floor,
and the time from the hog's first reading under the floor to the guard's SIGTERM (from the
guard's stop line) and to the hog's handler. Standard library, psutil and sparkserve only, so
it runs on any Linux machine:

    PYTHONPATH=src python3 benchmarks/guard_reaction.py --runs 5 --json guard-reaction.json

Prints a table and writes JSON; exit 1 when a run's guard did not stop the hog.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sparkserve.memory.host import GIB, read_meminfo

HOG = """
import json, signal, sys, time
from sparkserve.memory.host import read_meminfo  # what the guard reads (its cgroup's view too)
floor, cap, chunk = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def available():
    return read_meminfo().available
got = {}
signal.signal(signal.SIGTERM, lambda *_: got.setdefault("sigterm", time.time()))
sys.stdin.readline()  # go: the guard is watching
chunks, held, lowest, first = [], 0, available(), None
start = time.time()
while "sigterm" not in got and held < cap:
    chunks.append(b"\\x01" * chunk)  # allocated and written: every page touched
    held += chunk
    now = available()
    lowest = min(lowest, now)
    if first is None and now < floor:
        first = time.time()
grew = time.time() - start
deadline = time.time() + 10
while "sigterm" not in got and time.time() < deadline:
    time.sleep(0.01)
print(json.dumps({"first_below": first, "sigterm": got.get("sigterm"), "lowest": lowest,
                  "held": held, "rate": held / max(grew, 1e-6)}), flush=True)
"""
STOP_LINE = re.compile(r"stopping vLLM \(pid \d+\): (.*) \(at ([\d.]+)\)")


def run_once(work: Path, below: int, cap: int, chunk: int = 8 << 20) -> dict[str, object]:
    """One hog under one guard; the figures of the module docstring."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    floor = read_meminfo().available - below
    hog = subprocess.Popen(
        [sys.executable, "-c", HOG, str(floor), str(cap), str(chunk)],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    guard = subprocess.Popen(
        [sys.executable, "-m", "sparkserve.guard.monitor", "--pid", str(hog.pid),
         "--floor-gb", f"{floor / GIB:.4f}", "--swap-mb-s", "0", "--psi-full-pct", "0",
         "--grace-s", "5", "--textfile-dir", str(work)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert hog.stdin is not None and guard.stderr is not None
    try:
        watching = guard.stderr.readline()
        hog.stdin.write("go\n")
        hog.stdin.flush()
        report = json.loads(hog.communicate(timeout=120)[0])
        guard.wait(timeout=30)
    finally:
        hog.kill()
        guard.kill()
        guard.wait()
    log = watching + guard.stderr.read()
    stop = STOP_LINE.search(log)
    first = report["first_below"]
    return {
        "rate_gb_s": round(report["rate"] / 1e9, 3),
        "floor_gib": round(floor / GIB, 3),
        "lowest_gib": round(report["lowest"] / GIB, 3),
        "under_floor_gib": round((floor - report["lowest"]) / GIB, 3),
        "held_gib": round(report["held"] / GIB, 3),
        "first_below_to_sigterm_ms": (
            round((float(stop.group(2)) - first) * 1000, 1) if stop and first else None
        ),
        "first_below_to_handler_ms": (
            round((report["sigterm"] - first) * 1000, 1) if report["sigterm"] and first else None
        ),
        "guard_exit": guard.returncode,
        "reason": stop.group(1) if stop else None,
        "guard_log": log,
        "state_file": (work / "guard.prom").read_text() if (work / "guard.prom").exists() else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--below-gib", type=float, default=3.0, help="floor under MemAvailable")
    parser.add_argument("--cap-gib", type=float, default=6.0, help="the most a hog allocates")
    parser.add_argument("--json", type=Path, help="write the runs here")
    args = parser.parse_args(argv)
    if read_meminfo().available < (args.cap_gib + 4) * GIB:
        print(f"guard_reaction: needs {args.cap_gib + 4:g} GiB available", file=sys.stderr)
        return 2
    runs = []
    print("| hog GB/s | lowest under floor GiB | first under floor -> SIGTERM ms | -> handler ms |")
    print("| --- | --- | --- | --- |")
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as work:
            run = run_once(Path(work), int(args.below_gib * GIB), int(args.cap_gib * GIB))
        runs.append(run)
        print(
            f"| {run['rate_gb_s']} | {run['under_floor_gib']} | "
            f"{run['first_below_to_sigterm_ms']} | {run['first_below_to_handler_ms']} |",
            flush=True,
        )
        time.sleep(1)  # let the kernel settle the freed memory
    if args.json:
        machine = {"cpus": os.cpu_count(), "load": os.getloadavg(), "kernel": platform.release()}
        record = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine}
        args.json.write_text(json.dumps(record | {"runs": runs}, indent=1) + "\n")
    return 0 if all(r["guard_exit"] == 3 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
