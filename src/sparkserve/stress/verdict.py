"""PASS or FAIL from the memory samples: pure logic, no I/O.

PASS: swap used never rose above where it started (beyond a tolerance) and MemAvailable stayed
above the OS reserve in every sample. FAIL names the worst moment: the memory guard stopping
vLLM during the run, else the lowest MemAvailable when it went under the reserve, else the
highest swap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sparkserve.stress.sampler import Sample


@dataclass(frozen=True)
class GuardStop:
    """The memory guard's record of stopping vLLM (guard/monitor.py's marker), placed in the run."""

    t: float  # seconds since the sampler started
    reason: str


@dataclass(frozen=True)
class Verdict:
    passed: bool
    line: str
    worst_t: float | None
    worst_phase: str
    min_available_gib: float | None
    swap_growth_gib: float

    def as_dict(self) -> dict[str, object]:
        return {
            "result": "PASS" if self.passed else "FAIL",
            "line": self.line,
            "worst_t": self.worst_t,
            "worst_phase": self.worst_phase,
            "min_available_gib": self.min_available_gib,
            "swap_growth_gib": self.swap_growth_gib,
        }


def judge(
    samples: Sequence[Sample],
    os_reserve_gib: float,
    swap_tolerance_gib: float = 0.0,
    guard_stop: GuardStop | None = None,
) -> Verdict:
    if not samples:
        return Verdict(False, "FAIL: no memory samples were taken", None, "", None, 0.0)
    low = min(samples, key=lambda s: s.mem_available_gib)
    high = max(samples, key=lambda s: s.swap_used_gib)
    growth = max(high.swap_used_gib - samples[0].swap_used_gib, 0.0)
    if guard_stop is not None:
        during = [s.phase for s in samples if s.t <= guard_stop.t][-1:] or [""]
        at = f"during {during[0]}" if during[0] else "before the first phase"
        line = (
            f"FAIL: the memory guard stopped vLLM at t={guard_stop.t:.1f} s ({at}): "
            f"{guard_stop.reason}; lowest MemAvailable {low.mem_available_gib:.2f} GiB"
        )
        return Verdict(False, line, guard_stop.t, during[0], low.mem_available_gib, growth)
    under = low.mem_available_gib < os_reserve_gib
    swapped = growth > swap_tolerance_gib
    where = "before the first phase" if not low.phase else f"during {low.phase}"
    if under:
        line = (
            f"FAIL: MemAvailable fell to {low.mem_available_gib:.2f} GiB, under the OS reserve "
            f"of {os_reserve_gib:g} GiB, at t={low.t:.1f} s ({where})"
        )
        if swapped:
            line += f"; swap also grew by {growth * 1024:.0f} MiB"
        return Verdict(False, line, low.t, low.phase, low.mem_available_gib, growth)
    if swapped:
        at = "before the first phase" if not high.phase else f"during {high.phase}"
        line = (
            f"FAIL: swap grew by {growth * 1024:.0f} MiB (peak {high.swap_used_gib:.2f} GiB at "
            f"t={high.t:.1f} s, {at}); MemAvailable stayed above {os_reserve_gib:g} GiB"
        )
        return Verdict(False, line, high.t, high.phase, low.mem_available_gib, growth)
    line = (
        f"PASS: swap did not grow and MemAvailable stayed above the OS reserve of "
        f"{os_reserve_gib:g} GiB (lowest {low.mem_available_gib:.2f} GiB at t={low.t:.1f} s, "
        f"{where})"
    )
    return Verdict(True, line, low.t, low.phase, low.mem_available_gib, growth)
