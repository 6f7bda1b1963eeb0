"""What both loops share: the knob the server runs with now, a restart per candidate with the
time it took, an estimate of the whole run before it starts, and the promise that an
interrupted run (SIGINT or SIGTERM) puts the starting setting back before it exits."""

from __future__ import annotations

import signal
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType

from sparkserve.tune.driver import Driver


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the tune."""


@dataclass
class Restarts:
    """The server's setting of `knob` as the tune changes it. `running` is the value it runs
    with, None while a restart is under way (then only a restart to a known value is safe)."""

    driver: Driver
    knob: str
    start_value: str
    healthy_timeout_s: float
    say: Callable[[str], None]
    running: str | None = None
    took_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.running = self.start_value

    def serve(self, value: str, why: str) -> float:
        """Restart with `value` unless the server runs with it already; seconds it took."""
        if value == self.running:
            return 0.0
        self.say(f"[tune] restarting with {self.knob}={value} ({why})")
        self.running = None
        took = self.driver.restart({self.knob: value}, self.healthy_timeout_s)
        self.running = value
        self.took_s.append(took)
        self.say(f"[tune] healthy with {self.knob}={value} after {took:.1f} s")
        return took

    def restore(self) -> None:
        """Back to the starting setting, whatever signals arrive meanwhile."""
        with ignoring_signals():
            if self.running != self.start_value:
                self.say(f"[tune] restoring the starting setting {self.knob}={self.start_value}")
                self.running = None
                self.driver.restart({self.knob: self.start_value}, self.healthy_timeout_s)
                self.running = self.start_value
                self.say(f"[tune] the server runs with {self.knob}={self.start_value} again")

    def restart_estimate_s(self, default_s: float) -> float:
        return statistics.fmean(self.took_s) if self.took_s else default_s


def estimate_line(count: int, restart_s: float, measure_s: float, what: str) -> str:
    total = count * (restart_s + measure_s)
    return (
        f"[tune] {count} candidate(s), each a restart (about {restart_s:.0f} s) and {what} "
        f"(about {measure_s:.0f} s): about {total / 60:.1f} min in all"
    )


def progress_line(done: int, count: int, started: float, restart_s: float, measure_s: float) -> str:
    spent = time.monotonic() - started
    left = (count - done) * (restart_s + measure_s)
    return f"[tune] {done}/{count} candidates done after {spent:.0f} s; about {left:.0f} s left"


def _raise(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


@contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise Interrupted inside the block."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, _raise)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def ignoring_signals() -> Iterator[None]:
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, signal.SIG_IGN)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def knob_lines(changes: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in changes.items())
