"""What tune's loops and verify share: the setting the server runs with now, a restart per
candidate or reference with the time it took, an estimate of the whole run before it starts,
and the promise that an interrupted run (SIGINT or SIGTERM) puts the starting setting back
before it exits."""

from __future__ import annotations

import signal
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType

from sparkserve.server.driver import Driver


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the tune."""


@dataclass
class Restarter:
    """The server's setting as a tool (tune, verify) changes it. `start` is what it ran with
    when the tool began (None: a knob unset then, and unset again at the end); `current` is
    what it runs with now, None while a restart is under way (then only a restart to a known
    setting is safe). Every restart names every knob of `start`: a launcher driver keeps what
    a restart gave it. `restore` puts the starting setting back, whatever signals arrive."""

    driver: Driver
    start: dict[str, str | None]
    healthy_timeout_s: float
    say: Callable[[str], None]
    tag: str  # the tool's name, the lines' prefix
    current: dict[str, str | None] | None = None
    took_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.current = dict(self.start)

    @classmethod
    def of(
        cls,
        driver: Driver,
        knobs: Iterable[str],
        healthy_timeout_s: float,
        say: Callable[[str], None],
        tag: str,
    ) -> Restarter:
        """Starting from the values the driver reports for `knobs` now."""
        running = driver.knobs()
        return cls(driver, {k: running.get(k) for k in knobs}, healthy_timeout_s, say, tag)

    def running(self, knob: str) -> str | None:
        """The value `knob` runs with now; None while a restart is under way, or unset."""
        return None if self.current is None else self.current.get(knob)

    def serve(self, changes: Mapping[str, str | None], why: str) -> float:
        """Restart with `changes` over the starting setting, unless the server runs with that
        already; the seconds it took."""
        wanted = {**self.start, **changes}
        if wanted == self.current:
            return 0.0
        shown = show(changes)
        self.say(f"[{self.tag}] restarting with {shown} ({why})")
        self.current = None
        took = self.driver.restart(wanted, self.healthy_timeout_s)
        self.current = wanted
        self.took_s.append(took)
        self.say(f"[{self.tag}] healthy with {shown} after {took:.1f} s")
        return took

    def restore(self) -> None:
        """Back to the starting setting, whatever signals arrive meanwhile."""
        with ignoring_signals():
            if self.current != self.start:
                shown = show(self.start)
                self.say(f"[{self.tag}] restoring the starting setting {shown}")
                self.current = None
                self.driver.restart(self.start, self.healthy_timeout_s)
                self.current = dict(self.start)
                self.say(f"[{self.tag}] the server runs with {shown} again")

    def restart_estimate_s(self, default_s: float) -> float:
        return statistics.fmean(self.took_s) if self.took_s else default_s


def show(changes: Mapping[str, str | None]) -> str:
    """KNOB=value ..., `KNOB unset` for a knob the server runs without."""
    return " ".join(f"{k}={v}" if v is not None else f"{k} unset" for k, v in changes.items())


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
    with _stops_handled_by(_raise):
        yield


@contextmanager
def ignoring_signals() -> Iterator[None]:
    """SIGINT and SIGTERM are ignored inside the block (a restart that must not be cut)."""
    with _stops_handled_by(signal.SIG_IGN):
        yield


@contextmanager
def _stops_handled_by(
    handler: Callable[[int, FrameType | None], None] | signal.Handlers,
) -> Iterator[None]:
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def knob_lines(changes: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in changes.items())
