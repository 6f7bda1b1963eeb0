"""Memory pressure-stall information (PSI) from /proc/pressure/memory.

The kernel counts the time tasks spend stalled waiting for memory (reclaim, refaults, swap-in):
"some" while at least one task waits, "full" while every runnable task does. The avg10
figures are percentages over about the last 10 s; the totals are microseconds since boot. PSI
climbs while the kernel is already struggling for pages, seconds before MemAvailable hits
nothing; systemd-oomd acts on it (oomd.conf(5): 60 % for 30 s by default). Linux 4.20+; a
kernel built without it, or booted with psi=0, has no such file: readers then get None.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PSI_MEMORY = Path("/proc/pressure/memory")


@dataclass(frozen=True)
class Pressure:
    some_avg10: float  # percent of the last ~10 s with at least one task stalled on memory
    full_avg10: float  # percent of the last ~10 s with every runnable task stalled
    some_total_us: int  # stalled microseconds since boot
    full_total_us: int


def parse_pressure(text: str, source: str = str(PSI_MEMORY)) -> Pressure:
    """The two lines of a PSI file; ValueError naming `source` on anything else."""
    rows: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        kind, *fields = line.split() or [""]
        rows[kind] = dict(field.split("=", 1) for field in fields if "=" in field)
    try:
        some, full = rows["some"], rows.get("full", {"avg10": "0", "total": "0"})
        return Pressure(
            some_avg10=float(some["avg10"]),
            full_avg10=float(full["avg10"]),
            some_total_us=int(some["total"]),
            full_total_us=int(full["total"]),
        )
    except (KeyError, ValueError) as error:
        raise ValueError(f"{source}: not a PSI file ({error})") from None


def read_pressure(path: Path = PSI_MEMORY) -> Pressure | None:
    """The memory PSI now, or None where the kernel provides none we can read (the guard must
    keep running on such a kernel, with its other rules)."""
    try:
        return parse_pressure(path.read_text(), str(path))
    except (OSError, ValueError):
        return None


class StallRate:
    """Share of wall time (0..1) stalled since the previous reading, from the totals: finer
    than avg10, which the kernel updates only every 2 s."""

    def __init__(self) -> None:
        self._last: tuple[float, Pressure] | None = None

    def add(self, now: float, pressure: Pressure) -> tuple[float, float]:
        """(some, full) shares since the last call; (0, 0) on the first."""
        last, self._last = self._last, (now, pressure)
        if last is None or now <= last[0]:
            return 0.0, 0.0
        span_us = (now - last[0]) * 1e6
        some = (pressure.some_total_us - last[1].some_total_us) / span_us
        full = (pressure.full_total_us - last[1].full_total_us) / span_us
        return min(max(some, 0.0), 1.0), min(max(full, 0.0), 1.0)
