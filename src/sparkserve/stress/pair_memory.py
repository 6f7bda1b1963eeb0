"""Both hosts' memory during a stress run on a pair (CLUSTER_NODES=2).

The head's pair watch knows both hosts' memory (each node's beat carries its reading); about
once a second this asks it with a wire probe and keeps, per host (head, worker), the lowest
MemAvailable and the swap seen. A pair passes when each host stayed above the OS reserve and
its swap did not grow; a watch that cannot be reached is one line, never a crash, and the
run then judges this host alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sparkserve.cluster import wire
from sparkserve.launch.settings import tool_settings
from sparkserve.stress.verdict import Verdict

HOSTS = {"0": "head", "1": "worker"}
PERIOD_S = 1.0
TIMEOUT_S = 2.0


@dataclass
class HostMemory:
    """One host's memory as the watch reported it during the run."""

    name: str
    readings: int = 0
    total_gib: float | None = None
    low_available_gib: float | None = None
    low_t: float | None = None  # seconds since the run's sampler started
    first_swap_gib: float | None = None
    peak_swap_gib: float | None = None

    def add(self, reading: Mapping[str, Any], t: float) -> None:
        available = float(reading["available_gib"])
        swap = float(reading["swap_used_gib"])
        self.readings += 1
        self.total_gib = float(reading.get("total_gib") or 0) or self.total_gib
        if self.low_available_gib is None or available < self.low_available_gib:
            self.low_available_gib, self.low_t = available, t
        if self.first_swap_gib is None:
            self.first_swap_gib = swap
        self.peak_swap_gib = max(swap, self.peak_swap_gib or 0.0)

    @property
    def swap_growth_gib(self) -> float:
        if self.first_swap_gib is None or self.peak_swap_gib is None:
            return 0.0
        return max(self.peak_swap_gib - self.first_swap_gib, 0.0)

    def problem(self, reserve_gib: float, swap_tolerance_gib: float) -> str | None:
        """Why this host fails the run, or None."""
        if self.readings == 0:
            return f"the watch never reported the {self.name}'s memory"
        low = self.low_available_gib or 0.0
        if low < reserve_gib:
            return (
                f"the {self.name}'s MemAvailable fell to {low:.2f} GiB, under the OS reserve "
                f"of {reserve_gib:g} GiB, at t={self.low_t:.1f} s"
            )
        if self.swap_growth_gib > swap_tolerance_gib:
            return f"the {self.name}'s swap grew by {self.swap_growth_gib * 1024:.0f} MiB"
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "readings": self.readings,
            "total_gib": self.total_gib,
            "min_available_gib": self.low_available_gib,
            "min_available_t": self.low_t,
            "swap_first_gib": self.first_swap_gib,
            "swap_peak_gib": self.peak_swap_gib,
            "swap_growth_gib": self.swap_growth_gib,
        }


def readings_of(message: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The per-rank readings of a watch's `about` answer; WireError when it is not one."""
    memory = message.get("memory")
    if message.get("kind") == "refused":  # CLUSTER_SECRET not the head's
        raise wire.WireError(f"it refused the probe: {message.get('reason')}")
    if message.get("kind") != "about" or not isinstance(memory, dict):
        raise wire.WireError(f"the watch answered {str(message)[:80]}, not an about")
    found = {}
    for rank, reading in memory.items():
        if rank not in HOSTS:
            continue
        try:
            float(reading["available_gib"]), float(reading["swap_used_gib"])
        except (TypeError, KeyError, ValueError):
            raise wire.WireError(f"rank {rank}'s reading is not one: {reading!r}") from None
        found[rank] = reading
    return found


@dataclass
class PairWatch:
    """Polls the head's watch on a thread of its own."""

    host: str
    port: int
    clock: Callable[[], float]  # the run's time (the memory sampler's `now`)
    secret: bytes = b""  # CLUSTER_SECRET: the watch answers probes that prove it
    period_s: float = PERIOD_S
    hosts: dict[str, HostMemory] = field(
        default_factory=lambda: {rank: HostMemory(name) for rank, name in HOSTS.items()}
    )
    failures: int = 0
    last_error: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    def poll(self) -> None:
        """One probe; a failure is counted and kept, never raised."""
        try:
            answer = wire.request(self.host, self.port, {"kind": "probe"}, TIMEOUT_S, self.secret)
            readings = readings_of(answer)
        except OSError as error:
            self.failures += 1
            self.last_error = str(error) or type(error).__name__
            return
        now = self.clock()
        for rank, reading in readings.items():
            self.hosts[rank].add(reading, now)

    def start(self) -> PairWatch:
        def loop() -> None:
            while not self._stop.is_set():
                self.poll()
                self._stop.wait(self.period_s)

        self._thread = threading.Thread(target=loop, daemon=True, name="pair-watch")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=TIMEOUT_S * 2 + 1)

    def report(self, reserve_gib: float, swap_tolerance_gib: float) -> dict[str, Any]:
        problems = [
            problem
            for host in self.hosts.values()
            if (problem := host.problem(reserve_gib, swap_tolerance_gib)) is not None
        ]
        return {
            "watch": self.where,
            "failed_probes": self.failures,
            "last_error": self.last_error or None,
            "hosts": {host.name: host.as_dict() for host in self.hosts.values()},
            "problems": problems,
        }


def watch_for(env: Mapping[str, str], clock: Callable[[], float]) -> tuple[PairWatch | None, str]:
    """The head's watch to poll when the knobs say this is a pair, once it answered one
    probe; else None and, for a pair, the one line saying why not."""
    settings = tool_settings(env)
    if not settings.pair:
        return None, ""
    host = settings.values.CLUSTER_HEAD_ADDR
    if not host:
        return None, "CLUSTER_NODES=2 but CLUSTER_HEAD_ADDR is empty: judging this host alone"
    secret = settings.values.CLUSTER_SECRET.encode()  # the tool's knobs: .env's included
    watch = PairWatch(host, settings.values.CLUSTER_WATCH_PORT, clock, secret)
    try:
        readings_of(wire.request(host, watch.port, {"kind": "probe"}, TIMEOUT_S, secret))
    except OSError as error:
        return None, (
            f"the pair watch at {watch.where} did not answer ({error}): judging this host alone"
        )
    return watch, ""


def with_pair(verdict: Verdict, report: Mapping[str, Any]) -> Verdict:
    """The run's verdict with both hosts' memory: FAIL when either host failed."""
    problems = list(report["problems"])
    if not problems:
        lows = " and ".join(
            f"{name} {host['min_available_gib']:.2f} GiB" for name, host in report["hosts"].items()
        )
        return replace(verdict, line=f"{verdict.line}; on the pair, lowest MemAvailable: {lows}")
    here = "" if verdict.passed else "; " + verdict.line.removeprefix("FAIL: ")
    return replace(verdict, passed=False, line="FAIL: " + "; ".join(problems) + here)


def table(report: Mapping[str, Any]) -> str:
    """Per host: readings, lowest MemAvailable (and when), swap first and peak."""
    lines = [f"{'host':<7} {'readings':>8} {'lowest MemAvailable':>22} {'swap first -> peak':>20}"]
    for name, host in report["hosts"].items():
        low = host["min_available_gib"]
        at = f"{low:.2f} GiB at {host['min_available_t']:.0f} s" if low is not None else "-"
        first, peak = host["swap_first_gib"], host["swap_peak_gib"]
        swap = f"{first:.2f} -> {peak:.2f} GiB" if first is not None else "-"
        lines.append(f"{name:<7} {host['readings']:>8} {at:>22} {swap:>20}")
    if report["failed_probes"]:
        failed = f"{report['failed_probes']} probes of {report['watch']} failed"
        lines.append(f"({failed}; the last: {report['last_error']})")
    return "\n".join(lines)
