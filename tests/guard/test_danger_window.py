"""The guard's danger window against a neighbour's memory hog: serve.sh with a `vllm` that
sleeps (the launcher, the keeper and the guard are the real ones), in a memory cgroup of the
test's own (what a container's mem_limit is), and a hog beside it in the same cgroup. A hog
that keeps MemAvailable under the floor for 1 s leaves the server up; one that stays there
stops it once the window has passed, within the promised bound; an OOM kill in the server's
cgroup stops it at the guard's next reading. (The emergency under half the floor:
test_guard.py, the fast hog.)"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from test_guard import ENV, HANG_S, REPO, fake_vllm

from sparkserve.guard.danger import DANGER_S
from sparkserve.guard.keeper import HUNG_AFTER_S
from sparkserve.knobs.registry import BY_NAME
from sparkserve.memory.host import GIB
from support.memory_cgroup import MemoryCgroup, memory_cgroup
from support.promises import GUARD_REACTION_S, GUARD_WINDOW_STOP_S
from support.vllm_server import metric_sum, parse_metrics

# Eats memory until MemAvailable (as the guard reads it: its cgroup's headroom) is under
# TARGET, prints when its readings first went under FLOOR and under TARGET, holds until HOLD_S
# seconds after the first went under FLOOR, frees it all and prints when.
HOG = """
import sys, time
from sparkserve.memory.host import read_meminfo
floor, target, hold_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
chunks, crossed = [], None
while (available := read_meminfo().available) >= target:
    if crossed is None and available < floor:
        crossed = time.time()
    chunks.append(b"\\x01" * (16 << 20))  # allocated and written: every page touched
if crossed is None:
    crossed = time.time()
print(f"crossed={crossed:.3f} reached={time.time():.3f}", flush=True)
time.sleep(max(0.0, crossed + hold_s - time.time()))
chunks.clear()
print(f"freed={time.time():.3f} available={read_meminfo().available}", flush=True)
"""
STOP_LINE = re.compile(r"stopping vLLM \(pid (\d+)\): (.*) \(at ([\d.]+)\)")
PASSED = re.compile(r"danger passed after ([\d.]+) s: MemAvailable")
CGROUP_BYTES = 4 * GIB
FLOOR_UNDER = 5 * GIB // 4  # the floor: this far under the cgroup's headroom before the server
# Where the hog holds: this far under the floor, a few chunks past it, so that its time under
# the floor is its hold, not its allocation (0.2-0.3 GB/s on 2 busy cores).
HOG_UNDER_FLOOR = 128 << 20


def test_the_knobs_say_the_window_the_guard_uses() -> None:
    """The knob table's sentences (README, docs/KNOBS.md) name the window in words: it must
    be the guard's own."""
    for name in ("GUARD", "GUARD_FLOOR_GB", "GUARD_SWAP_MB_S", "GUARD_PSI_PCT"):
        assert f"for {DANGER_S:g} s" in BY_NAME[name].why, name


def _wait_watching(state_file: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if metric_sum(parse_metrics(state_file.read_text()), "sparkserve_guard_watching"):
                return
        time.sleep(0.05)
    raise AssertionError(f"no guard wrote `watching 1` into {state_file}")


@contextlib.contextmanager
def _server(tmp_path: Path, cgroup: MemoryCgroup, floor: int) -> Iterator[subprocess.Popen[str]]:
    """serve.sh with a sleeping `vllm` in `cgroup`, its guard's floor at `floor` bytes; its
    stderr goes to tmp_path/launcher.log."""
    tmp_path.mkdir()
    env, _ = fake_vllm(tmp_path)
    (tmp_path / "bin" / "vllm").write_text("#!/bin/sh\nexec sleep 300\n")
    env["GUARD_FLOOR_GB"] = f"{floor / GIB:.3f}"
    with (tmp_path / "launcher.log").open("w") as log:
        launcher = subprocess.Popen(
            [str(REPO / "serve.sh")], env=env, stdout=subprocess.DEVNULL, stderr=log, text=True,
            preexec_fn=cgroup.preexec,
        )  # fmt: skip
    try:
        _wait_watching(tmp_path / "hf" / "sparkserve" / "metrics" / "guard.prom",
                       time.monotonic() + HANG_S)  # fmt: skip
        yield launcher
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            for process in [*psutil.Process(launcher.pid).children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
        launcher.kill()
        launcher.wait()


def _hog(cgroup: MemoryCgroup, floor: int, hold_s: float) -> subprocess.Popen[str]:
    """The neighbour: in the server's cgroup, ahead of it in the CPU queue (2 busy cores)."""

    def preexec() -> None:
        cgroup.join()
        os.nice(-10)

    return subprocess.Popen(
        [sys.executable, "-c", HOG, str(floor), str(floor - HOG_UNDER_FLOOR), str(hold_s)],
        env=ENV, stdout=subprocess.PIPE, text=True, preexec_fn=preexec,
    )  # fmt: skip


def _figures(line: str) -> dict[str, float]:
    return {key: float(value) for key, value in re.findall(r"(\w+)=([\d.]+)", line)}


@pytest.mark.memory_hog
def test_a_one_second_spike_passes_and_a_sustained_hog_stops_the_server(tmp_path: Path) -> None:
    with memory_cgroup(CGROUP_BYTES) as cgroup:
        floor = cgroup.headroom() - FLOOR_UNDER
        # The spike: under the floor for about a second, then gone.
        with _server(tmp_path / "spike", cgroup, floor) as launcher:
            hog = _hog(cgroup, floor, hold_s=1.0)
            out, _ = hog.communicate(timeout=HANG_S)
            spike = _figures(out)
            # Past the window since the crossing, and a reading or two more.
            time.sleep(max(0.0, spike["crossed"] + DANGER_S + 1.0 - time.time()))
            assert launcher.poll() is None, "a 1 s spike stopped the server"
        spike_log = (tmp_path / "spike" / "launcher.log").read_text()
        assert not STOP_LINE.search(spike_log), spike_log
        assert not (tmp_path / "spike" / "hf" / "sparkserve" / "guard-stopped.json").exists()
        # The guard saw the spike (a guard that saw nothing would pass this test too) and let
        # it pass within the window.
        assert "danger: MemAvailable" in spike_log, spike_log
        passed = PASSED.search(spike_log)
        assert passed and float(passed.group(1)) < DANGER_S, spike_log
        under_s = spike["freed"] - spike["crossed"]
        print(f"spike: under the floor {under_s:.2f} s (hog), the guard's danger "
              f"{passed.group(1)} s; the server ran on")  # fmt: skip
        assert under_s >= 1.0  # it was a spike of a second, not less

        # The sustained hog: under the floor, far above half of it, and staying there.
        with _server(tmp_path / "held", cgroup, floor) as launcher:
            hog = _hog(cgroup, floor, hold_s=HANG_S)
            try:
                assert hog.stdout is not None
                held = _figures(hog.stdout.readline())
                launcher.wait(timeout=HANG_S)
                exited = time.time()
            finally:
                hog.kill()
                hog.wait()
    log = (tmp_path / "held" / "launcher.log").read_text()
    stop = STOP_LINE.search(log)
    assert stop, log
    assert "fell below the floor" in stop.group(2) and "in danger for" in stop.group(2), log
    assert "half the floor" not in stop.group(2)  # the window acted, not the emergency
    took = float(stop.group(3)) - held["crossed"]
    print(f"sustained: the hog's first reading under the floor to the guard's stop {took:.2f} s,"
          f" to the launcher's exit {exited - held['crossed']:.2f} s")  # fmt: skip
    # The guard's first reading under the floor comes after the hog's (or within the chunk the
    # hog was writing): the window, less that chunk's time, at the least.
    assert DANGER_S - 0.1 <= took < GUARD_WINDOW_STOP_S, log
    record = json.loads(
        (tmp_path / "held" / "hf" / "sparkserve" / "guard-stopped.json").read_text()
    )
    assert "in danger for" in record["reason"]
    assert launcher.returncode != 0  # the stand-in has no API server: its SIGKILL ends the wait


@pytest.mark.memory_hog
def test_an_oom_kill_in_the_servers_cgroup_stops_it_at_the_next_reading(tmp_path: Path) -> None:
    """The OOM killer strikes while the guard is between readings (here SIGSTOPped: a starved
    guard); at its next reading MemAvailable is back, but the kill in its cgroup stops the
    watched process at once, without a window."""
    with memory_cgroup(GIB) as cgroup:
        served = subprocess.Popen(["sleep", "300"], preexec_fn=cgroup.preexec)
        guard = subprocess.Popen(
            [sys.executable, "-m", "sparkserve.guard.monitor", "--pid", str(served.pid),
             "--floor-gb", "0.5", "--swap-mb-s", "0", "--psi-full-pct", "0", "--grace-s", "5"],
            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            preexec_fn=cgroup.preexec,
        )  # fmt: skip
        try:
            assert guard.stderr is not None
            watching = guard.stderr.readline()
            assert "its OOM kills" in watching, watching
            guard.send_signal(signal.SIGSTOP)
            hog = subprocess.run(
                [sys.executable, "-c", "x = b'\\x01' * (2 << 30)"],
                preexec_fn=cgroup.preexec, capture_output=True, timeout=HANG_S, check=False,
            )  # fmt: skip
            assert hog.returncode == -signal.SIGKILL, hog  # the OOM killer's
            resumed = time.time()
            guard.send_signal(signal.SIGCONT)
            guard.wait(timeout=HANG_S)
            served.wait(timeout=HANG_S)
        finally:
            guard.send_signal(signal.SIGCONT)
            guard.kill()
            served.kill()
            guard.wait()
            served.wait()
    log = watching + guard.stderr.read()
    stop = STOP_LINE.search(log)
    assert guard.returncode == 3 and stop, log
    assert "the OOM killer killed 1 process(es) in this server's memory cgroup" in stop.group(2)
    print(f"SIGCONT to the guard's stop: {float(stop.group(3)) - resumed:.3f} s")
    assert float(stop.group(3)) - resumed < GUARD_REACTION_S


def test_a_hung_state_file_disk_never_delays_a_reading(tmp_path: Path) -> None:
    """The state file's folder on a FIFO-backed path that blocks every write (a hung disk):
    the guard keeps reading (its beats keep coming, so its keeper would not call it hung)."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    served = subprocess.Popen(["sleep", "60"])
    beats, beat_end = os.pipe()
    # guard.prom's temporary name is `.guard.prom.<pid>`: a FIFO there blocks the writer's
    # open() until someone reads it, which nobody does.
    guard = subprocess.Popen(
        [sys.executable, "-c",
         "import os, sys\n"
         "os.mkfifo(f'{sys.argv[1]}/.guard.prom.{os.getpid()}')\n"
         "from sparkserve.guard.monitor import main\n"
         "sys.exit(main(sys.argv[2:]))\n",
         str(metrics), "--pid", str(served.pid), "--floor-gb", "0.5", "--swap-mb-s", "0",
         "--textfile-dir", str(metrics), "--beat-fd", str(beat_end)],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        pass_fds=(beat_end,),
    )  # fmt: skip
    os.close(beat_end)
    try:
        with open(beats, "rb", buffering=0) as pipe:
            gaps, last = [], None
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                ready, _, _ = select.select([pipe], [], [], HANG_S)
                assert ready and pipe.read(1), "the guard took no reading, or exited"
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last = now
        # The writer is stuck in the FIFO's open(): no state file ever appeared.
        assert not (metrics / "guard.prom").exists()
        assert guard.poll() is None
    finally:
        served.kill()
        served.wait()
        guard.kill()
        guard.wait()
    print(f"{len(gaps) + 1} readings in 3 s with the state file's disk hung; largest gap "
          f"{max(gaps):.2f} s")  # fmt: skip
    # the behaviour: readings go on, none late enough for the keeper to call the guard hung
    assert len(gaps) >= 5 and max(gaps) < HUNG_AFTER_S
