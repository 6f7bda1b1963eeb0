"""The memory guard's state as a Prometheus text file, for node-exporter's textfile collector.

The guard writes `guard.prom` into a directory on the model-cache volume
($HF_HOME/sparkserve/metrics); the metrics profile's node-exporter reads that directory
(`--collector.textfile.directory`), so Prometheus sees the guard's limits, what it last read
and whether it stopped vLLM, without the guard serving anything. The file is replaced
atomically (written beside it, then renamed), so the collector never reads half a file, and by
a thread of its own (StateWriter): the volume may be a slow or hung disk, and a write that
takes seconds must neither delay the guard's next reading nor make it look hung to its keeper.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = "guard.prom"
REASONS = ("mem_available", "swap_out", "psi", "oom_kill")


@dataclass
class GuardState:
    floor_bytes: int
    os_reserve_bytes: int
    swap_limit_bytes_s: float  # 0: check off
    psi_limit_pct: float  # 0: check off
    watching: bool = True
    mem_available_bytes: int = 0
    psi_full_avg10: float | None = None
    danger_s: float = 0.0  # how long the current danger has held (docs/MEMORY.md)
    tripped: str | None = None  # one of REASONS once the guard stopped vLLM
    trip_time: float = 0.0


_METRICS = (
    ("watching", "gauge", "1 while the guard watches vLLM, 0 after it exited"),
    ("floor_bytes", "gauge", "MemAvailable below this stops vLLM (GUARD_FLOOR_GB)"),
    ("os_reserve_bytes", "gauge", "memory kept outside vLLM's share (OS_RESERVE_GB)"),
    ("swap_limit_bytes_per_second", "gauge", "swap-out faster than this stops vLLM; 0 off"),
    ("psi_limit_percent", "gauge", "PSI memory full avg10 at or above this stops vLLM; 0 off"),
    ("mem_available_bytes", "gauge", "MemAvailable at the guard's last reading"),
    ("psi_full_avg10_percent", "gauge", "PSI memory full avg10 at the guard's last reading"),
    ("danger_seconds", "gauge", "how long the current danger has held; 0 when there is none"),
    ("tripped", "gauge", "1 for the reason the guard stopped vLLM, else 0"),
    ("last_trip_timestamp_seconds", "gauge", "when the guard stopped vLLM; 0 if it did not"),
    ("updated_timestamp_seconds", "gauge", "when the guard wrote this file"),
)


def render(state: GuardState, now: float | None = None) -> str:
    values: dict[str, list[tuple[str, float]]] = {
        "watching": [("", float(state.watching))],
        "floor_bytes": [("", state.floor_bytes)],
        "os_reserve_bytes": [("", state.os_reserve_bytes)],
        "swap_limit_bytes_per_second": [("", state.swap_limit_bytes_s)],
        "psi_limit_percent": [("", state.psi_limit_pct)],
        "mem_available_bytes": [("", state.mem_available_bytes)],
        "psi_full_avg10_percent": (
            [] if state.psi_full_avg10 is None else [("", state.psi_full_avg10)]
        ),
        "danger_seconds": [("", state.danger_s)],
        "tripped": [(f'{{reason="{r}"}}', float(state.tripped == r)) for r in REASONS],
        "last_trip_timestamp_seconds": [("", state.trip_time)],
        "updated_timestamp_seconds": [("", time.time() if now is None else now)],
    }
    lines: list[str] = []
    for name, kind, help_text in _METRICS:
        if not values[name]:
            continue
        full = f"sparkserve_guard_{name}"
        lines += [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"]
        lines += [f"{full}{labels} {value:.17g}" for labels, value in values[name]]
    return "\n".join(lines) + "\n"


def write(directory: Path | None, state: GuardState) -> None:
    """Replace directory/guard.prom with the state, here and now (StateWriter for the guard's
    loop); a write error is not the guard's problem."""
    if directory is not None:
        _replace(directory, render(state))


def _replace(directory: Path, text: str) -> None:
    target = directory / FILE_NAME
    temporary = directory / f".{FILE_NAME}.{os.getpid()}"
    with contextlib.suppress(OSError):
        directory.mkdir(parents=True, exist_ok=True)
        temporary.write_text(text)
        os.replace(temporary, target)


class StateWriter:
    """Writes the state file on a thread of its own. post() only hands the rendered text over
    (the newest replaces one not yet written), so it never waits on the disk."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._pending: str | None = None
        self._closed = False
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        if directory is not None:
            self._thread = threading.Thread(target=self._run, name="guard-state", daemon=True)
            self._thread.start()

    def post(self, state: GuardState) -> None:
        if self._thread is None:
            return
        text = render(state)
        with self._ready:
            self._pending = text
            self._ready.notify()

    def close(self, timeout_s: float, state: GuardState | None = None) -> bool:
        """Post the last state, if any, and wait up to `timeout_s` for what was posted to be
        written; False when the disk did not take it in time (the thread is a daemon: it never
        holds the exit)."""
        if self._thread is None:
            return True
        if state is not None:
            self.post(state)
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        assert self.directory is not None
        while True:
            with self._ready:
                while self._pending is None and not self._closed:
                    self._ready.wait()
                text, self._pending = self._pending, None
            if text is None:
                return
            _replace(self.directory, text)
