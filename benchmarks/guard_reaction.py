"""How fast the memory guard stops a process that eats memory: its two rules.

The watched process is itself the hog: it allocates and touches 8 MiB chunks, reads
MemAvailable after each (as the guard does: its cgroup's headroom where that is less), and
notes its first reading under the level that acts and when its SIGTERM handler runs. The guard
(`python -m sparkserve.guard.monitor`, default polling) watches it.

- `--rule emergency` (the default): the hog eats as fast as it can, through the floor and on
  below half of it, where the guard stops it at once. The floor is set so that its half lies
  `--below-gib` under MemAvailable at the start, and the danger window to 60 s, so that only
  the emergency acts.
- `--rule window`: the floor is `--below-gib` under MemAvailable; the hog eats until its first
  reading under it (far above half the floor) and holds: the guard stops it once the danger
  held for its window (guard/danger.py, the default DANGER_S).

Per run: the hog's rate, the lowest MemAvailable against the level, and the time from the
hog's first reading under the level to the guard's SIGTERM (from the guard's stop line) and to
the hog's handler. Standard library, psutil and sparkserve only, so it runs on any Linux machine:

    PYTHONPATH=src python3 benchmarks/guard_reaction.py --runs 5 --json guard-reaction.json
    PYTHONPATH=src python3 benchmarks/guard_reaction.py --rule window --runs 5

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
level, cap, chunk = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def available():
    return read_meminfo().available
got = {}
signal.signal(signal.SIGTERM, lambda *_: got.setdefault("sigterm", time.time()))
sys.stdin.readline()  # go: the guard is watching
chunks, held, lowest, first = [], 0, available(), None
start = time.time()
while "sigterm" not in got and held < cap and (first is None or sys.argv[4] == "on"):
    chunks.append(b"\\x01" * chunk)  # allocated and written: every page touched
    held += chunk
    now = available()
    lowest = min(lowest, now)
    if first is None and now < level:
        first = time.time()
grew = time.time() - start
deadline = time.time() + 30
while "sigterm" not in got and time.time() < deadline:
    time.sleep(0.01)
print(json.dumps({"first_below": first, "sigterm": got.get("sigterm"), "lowest": lowest,
                  "held": held, "rate": held / max(grew, 1e-6)}), flush=True)
"""
STOP_LINE = re.compile(r"stopping vLLM \(pid \d+\): (.*) \(at ([\d.]+)\)")


def run_once(
    work: Path, below: int, cap: int, rule: str = "emergency", chunk: int = 8 << 20
) -> dict[str, object]:
    """One hog under one guard; the figures of the module docstring."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    level = read_meminfo().available - below  # where the rule under test acts
    emergency = rule == "emergency"
    floor, window = (2 * level, ["--danger-s", "60"]) if emergency else (level, [])
    keep_on = "on" if emergency else "stop"  # past the level, or hold there
    hog = subprocess.Popen(
        [sys.executable, "-c", HOG, str(level), str(cap), str(chunk), keep_on],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    guard = subprocess.Popen(
        [sys.executable, "-m", "sparkserve.guard.monitor", "--pid", str(hog.pid),
         "--floor-gb", f"{floor / GIB:.4f}", "--swap-mb-s", "0", "--psi-full-pct", "0",
         "--grace-s", "5", "--textfile-dir", str(work), *window],
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
        "rule": rule,
        "floor_gib": round(floor / GIB, 3),
        "level_gib": round(level / GIB, 3),
        "lowest_gib": round(report["lowest"] / GIB, 3),
        "under_level_gib": round((level - report["lowest"]) / GIB, 3),
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
    parser.add_argument(
        "--rule", choices=("emergency", "window"), default="emergency", help="module docstring"
    )
    parser.add_argument(
        "--below-gib", type=float, default=3.0, help="the level that acts, under MemAvailable"
    )
    parser.add_argument("--cap-gib", type=float, default=6.0, help="the most a hog allocates")
    parser.add_argument("--json", type=Path, help="write the runs here")
    args = parser.parse_args(argv)
    if read_meminfo().available < (args.below_gib + 1) * GIB or args.cap_gib <= args.below_gib:
        print(
            f"guard_reaction: needs {args.below_gib + 1:g} GiB available and a --cap-gib over "
            "--below-gib",
            file=sys.stderr,
        )
        return 2
    runs = []
    print(
        "| hog GB/s | lowest under the level GiB | first under it -> SIGTERM ms | -> handler ms |"
    )
    print("| --- | --- | --- | --- |")
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as work:
            below, cap = int(args.below_gib * GIB), int(args.cap_gib * GIB)
            run = run_once(Path(work), below, cap, args.rule)
        runs.append(run)
        print(
            f"| {run['rate_gb_s']} | {run['under_level_gib']} | "
            f"{run['first_below_to_sigterm_ms']} | {run['first_below_to_handler_ms']} |",
            flush=True,
        )
        time.sleep(1)  # let the kernel settle the freed memory
    if args.json:
        machine = {"cpus": os.cpu_count(), "load": os.getloadavg(), "kernel": platform.release()}
        record = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine,
            "rule": args.rule,
        }
        args.json.write_text(json.dumps(record | {"runs": runs}, indent=1) + "\n")
    return 0 if all(r["guard_exit"] == 3 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
