"""PASS or FAIL from the memory samples (sparkserve.stress.verdict)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkserve.guard.monitor import Trip, write_marker
from sparkserve.stress.cli import guard_stop
from sparkserve.stress.sampler import Sample
from sparkserve.stress.verdict import GuardStop, judge


def _samples(avail: list[float], swap: list[float] | None = None) -> list[Sample]:
    swap = swap or [0.0] * len(avail)
    return [
        Sample(i / 10, a, 10.0, s, 0.0, 0.0, phase="idle" if i == 0 else f"c={1 + i // 3}")
        for i, (a, s) in enumerate(zip(avail, swap, strict=True))
    ]


def test_verdict_pass() -> None:
    verdict = judge(_samples([30, 25, 20, 22]), os_reserve_gib=14)
    assert verdict.passed and verdict.line.startswith("PASS")
    assert verdict.min_available_gib == 20 and verdict.worst_t == pytest.approx(0.2)


def test_verdict_fail_names_the_lowest_moment() -> None:
    verdict = judge(_samples([30, 20, 12, 9, 13, 25]), os_reserve_gib=14)
    assert not verdict.passed
    assert verdict.worst_t == pytest.approx(0.3) and verdict.worst_phase == "c=2"
    assert "9.00 GiB" in verdict.line and "t=0.3 s" in verdict.line and "c=2" in verdict.line


def test_verdict_fail_on_swap_growth_and_tolerance() -> None:
    samples = _samples([30, 30, 30, 30], swap=[1.0, 1.0, 1.5, 1.2])
    verdict = judge(samples, os_reserve_gib=14)
    assert not verdict.passed and "swap grew by 512 MiB" in verdict.line
    assert verdict.worst_t == pytest.approx(0.2)
    assert judge(samples, os_reserve_gib=14, swap_tolerance_gib=0.6).passed
    assert judge(_samples([30, 30], swap=[2.0, 1.0]), os_reserve_gib=14).passed  # shrank
    assert not judge([], os_reserve_gib=14).passed


def test_verdict_names_a_guard_stop(tmp_path: Path) -> None:
    samples = _samples([30, 25, 20, 22])  # memory looked fine to the sampler
    verdict = judge(samples, os_reserve_gib=14, guard_stop=GuardStop(0.25, "PSI at 55 %"))
    assert not verdict.passed and verdict.worst_phase == "c=1"
    assert verdict.line == (
        "FAIL: the memory guard stopped vLLM at t=0.2 s (during c=1): PSI at 55 %; "
        "lowest MemAvailable 20.00 GiB"
    )
    # The guard's own record, as guard/monitor.py writes it, placed on the run's clock.
    record = tmp_path / "hf" / "sparkserve" / "guard-stopped.json"
    write_marker(record, Trip("MemAvailable 1.00 GiB fell below", 1.0, 2.0, 0.0, 0.0, 1000.5), 7)
    assert guard_stop(None, {"HF_HOME": str(tmp_path / "hf")}, 990.0) == GuardStop(
        10.5, "MemAvailable 1.00 GiB fell below"
    )
    assert guard_stop(record, {}, 1001.0) is None  # an older stop than this run
    assert guard_stop(None, {}, 990.0) is None and guard_stop(tmp_path / "x", {}, 0.0) is None
