"""The guard's danger window: a danger stops vLLM only once it has held for the window.

A reading in danger (MemAvailable under the floor, swap-out over its limit, memory pressure at
its limit) opens a streak; the first reading without danger ends it. Only a streak that lasts
`window_s` stops vLLM: a neighbour's allocation that comes and goes within a second, a burst of
swap-out, a short PSI peak pass without costing the server its streams and a model reload.
What cannot wait (the OOM killer at work in this server's cgroup, MemAvailable under half the
floor) is the monitor's emergency rule, which never waits for a streak.
"""

from __future__ import annotations

from dataclasses import dataclass

DANGER_S = 3.0  # the window; docs/MEMORY.md ("The guard") has the measured danger-to-stop time


@dataclass(frozen=True)
class Streak:
    rule: str  # as guard_textfile.REASONS names it
    reason: str  # in words, at the latest reading
    began: float  # time.monotonic() of the streak's first reading
    held_s: float  # from its first reading to the latest


class Window:
    """Follows the streak of readings in danger."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.began: float | None = None

    def add(self, now: float, found: tuple[str, str] | None) -> Streak | None:
        """The streak after this reading (`found`: (rule, reason), or None for no danger)."""
        if found is None:
            self.began = None
            return None
        if self.began is None:
            self.began = now
        return Streak(found[0], found[1], self.began, now - self.began)

    def over(self, streak: Streak | None) -> bool:
        """Whether the streak has held for the whole window."""
        return streak is not None and streak.held_s >= self.window_s
