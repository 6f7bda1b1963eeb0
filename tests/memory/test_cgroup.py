"""A memory cgroup's limit decides what is available (sparkserve.memory.cgroup and host): real
cgroups of the kernel this runs on, made for each test (tests/support/memory_cgroup.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import psutil

from sparkserve.memory.host import GIB, MIB
from support.memory_cgroup import memory_cgroup

READ = """
import json, sys
from sparkserve.memory.host import read_meminfo
def figures():
    m = read_meminfo()
    return {"total": m.total, "available": m.available, "limit": m.cgroup_limit}
before = figures()
held = bytearray(int(sys.argv[1]))
held[::4096] = b"\\x01" * len(range(0, len(held), 4096))  # every page touched
print(json.dumps({"before": before, "after": figures()}))
"""


def _read_inside(preexec: object, hold_bytes: int) -> dict[str, dict[str, int | None]]:
    done = subprocess.run(
        [sys.executable, "-c", READ, str(hold_bytes)],
        capture_output=True, text=True, timeout=60, preexec_fn=preexec, check=True,  # type: ignore[arg-type]
    )  # fmt: skip
    return json.loads(done.stdout)


def test_a_process_under_a_limit_sees_the_headroom_under_it() -> None:
    with memory_cgroup(GIB) as cgroup:
        seen = _read_inside(cgroup.preexec, 256 * MIB)
    before, after = seen["before"], seen["after"]
    assert before["limit"] == GIB and before["total"] == psutil.virtual_memory().total
    assert 700 * MIB < before["available"] <= GIB  # (the interpreter itself uses some)
    assert before["available"] - after["available"] >= 240 * MIB  # its own pages count


def test_without_a_limit_the_host_decides() -> None:
    with memory_cgroup(GIB) as cgroup:
        cgroup.set_limit(None)
        seen = _read_inside(cgroup.preexec, 0)
    assert seen["before"]["limit"] is None
    assert seen["before"]["available"] > GIB  # not the limit set first


def test_the_guard_stops_a_process_that_fills_its_cgroup_on_a_roomy_host(tmp_path: Path) -> None:
    """A container's case: the host has GiBs to spare, the cgroup's limit is near."""
    hog = (
        "import time\n"
        "held = []\n"
        "for _ in range(40):\n"  # at most 1.25 GiB in 32 MiB steps, over the 1.5 GiB limit's floor
        "    b = bytearray(32 << 20); b[::4096] = b'\\x01' * len(range(0, len(b), 4096))\n"
        "    held.append(b); time.sleep(0.05)\n"
        "time.sleep(30)\n"
    )
    with memory_cgroup(3 * GIB // 2) as cgroup:
        watched = subprocess.Popen([sys.executable, "-c", hog], preexec_fn=cgroup.preexec)
        try:
            guard = subprocess.run(
                [sys.executable, "-m", "sparkserve.guard.monitor", "--pid", str(watched.pid),
                 "--floor-gb", "0.5", "--swap-mb-s", "0", "--psi-full-pct", "0",
                 "--grace-s", "2", "--textfile-dir", str(tmp_path)],
                capture_output=True, text=True, timeout=60, preexec_fn=cgroup.preexec,
            )  # fmt: skip
        finally:
            watched.kill()
            watched.wait()
    assert psutil.virtual_memory().available > 2 * GIB  # the host never was the reason
    assert "or left under its cgroup limit, 1.50 GiB" in guard.stderr, guard.stderr
    stop = re.search(
        r"stopping vLLM \(pid (\d+)\): MemAvailable ([\d.]+) GiB fell below", guard.stderr
    )
    assert stop and int(stop.group(1)) == watched.pid, guard.stderr
    assert float(stop.group(2)) <= 0.5  # (two decimals)
