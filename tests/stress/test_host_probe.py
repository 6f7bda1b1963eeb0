"""The memory sampler's own process (sparkserve.stress.host_probe): its JSON rows on the
shared monotonic clock, its schedule after a stall, and its exit when the parent lets go.
(Its rate under a busy parent, through MemorySampler: tests/stress/test_sampler.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sparkserve.memory.host import GIB
from sparkserve.memory.pressure import read_pressure

SRC = Path(__file__).resolve().parents[2] / "src"
HZ = 20.0


@pytest.fixture
def probe() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "sparkserve.stress.host_probe", str(HZ)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(SRC)),
    )  # fmt: skip
    yield process
    if process.poll() is None:
        process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None and not stream.closed:
            stream.close()


def rows(process: subprocess.Popen[str], count: int) -> list[list[float | None]]:
    assert process.stdout is not None
    return [json.loads(process.stdout.readline()) for _ in range(count)]


def test_rows_are_host_memory_on_the_shared_clock(probe: subprocess.Popen[str]) -> None:
    before = time.monotonic()
    got = rows(probe, 6)
    after = time.monotonic()
    assert all(len(row) == 8 for row in got)
    times = [row[0] for row in got]
    # this process's monotonic clock (another clock would be far off), whatever the load
    assert before - 60.0 < times[0] and times[-1] <= after
    assert times == sorted(times) and len(set(times)) == len(times)
    total_gib = psutil.virtual_memory().total / GIB
    for _, available, used, swap, swap_in, swap_out, *_psi in got:
        assert 0 < available <= total_gib and 0 < used <= total_gib  # type: ignore[operator]
        assert swap >= 0 and swap_in >= 0 and swap_out >= 0  # type: ignore[operator]
    assert got[0][4:] == [0.0, 0.0, None, None]  # no interval before the first row
    has_psi = read_pressure() is not None
    for *_, some, full in got[1:]:
        assert (some is not None and full is not None) == has_psi
        assert some is None or 0 <= full <= some <= 100  # type: ignore[operator]


def test_exits_when_its_stdin_is_closed(probe: subprocess.Popen[str]) -> None:
    rows(probe, 1)
    assert probe.stdin is not None
    probe.stdin.close()
    assert probe.wait(timeout=60) == 0  # a guard against a hang


def test_exits_quietly_when_its_reader_goes_away(probe: subprocess.Popen[str]) -> None:
    rows(probe, 1)
    assert probe.stdout is not None and probe.stderr is not None
    probe.stdout.close()  # the next row meets a broken pipe
    assert probe.wait(timeout=60) == 0
    assert probe.stderr.read() == ""


def test_after_a_stall_it_skips_the_missed_ticks_instead_of_catching_up(
    probe: subprocess.Popen[str],
) -> None:
    rows(probe, 2)
    probe.send_signal(signal.SIGSTOP)
    time.sleep(1.0)  # 20 ticks missed
    resumed = time.monotonic()
    probe.send_signal(signal.SIGCONT)
    later: list[float] = []
    while not later or later[-1] < resumed + 0.3:
        at = rows(probe, 1)[0][0]
        assert isinstance(at, float)
        if at >= resumed:
            later.append(at)
    # At 20 Hz, 0.1 s after waking holds the row written on waking and at most two ticks;
    # catching up would write the 20 missed rows at once.
    assert len([at for at in later if at < resumed + 0.1]) <= 4
