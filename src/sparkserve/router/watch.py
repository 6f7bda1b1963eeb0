"""The fleet watch in `sparkserve router`'s key gate: every ROUTER_FLEET_CHECK_S it compares
the replicas as `sparkserve doctor --fleet` does (sparkserve.router.fleet: the same probe and
the same majority) and keeps the router's rotation to the replicas alike.

vllm-router 0.1.17 checks only /health, so without this a replica restarted with another model
or other settings would be served like the others. A replica that differs from the fleet, or
that answers but cannot be compared (401: the router's key is not its key; another model), is
taken out through the router's loopback admin route (/remove_worker, as `sparkserve router
drain` does) and put back (/add_worker) when a later check finds it alike. Only what the watch
took out is put back: a replica drained by hand stays out.

A replica that does not answer, or whose /health is not 200, is left alone: the router's own
health checks and circuit breaker take it out and bring it back (they see the same thing first,
within ROUTER_HEALTH_INTERVAL_S). Its comparison waits for a check that reaches it.

Checked: every replica of ROUTER_WORKERS, every replica in rotation (one added by `sparkserve
router add` too) and every one the watch holds out.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sparkserve.router import admin
from sparkserve.router.fleet import DEFAULT_TIMEOUT_S, Verdict, check_fleet

RETRY_S = 0.5  # before the first check is applied: the router starts once a replica answers
REFUSED_METRIC = "sparkserve_router_replica_refused"
PROG = "sparkserve router"


@dataclass(frozen=True)
class Refusal:
    """A replica the watch holds out of rotation, and why (the fields that differ, both values)."""

    worker: str
    why: str
    differences: tuple[tuple[str, str, str], ...] = ()

    def as_json(self) -> dict[str, object]:
        return {
            "worker": self.worker,
            "why": self.why,
            "differences": [
                {"field": name, "here": here, "fleet": fleet}
                for name, here, fleet in self.differences
            ],
        }


@dataclass(frozen=True)
class FleetState:
    """What the gate reports: replaced whole by the watch's thread, read by the gate's loop."""

    applied: bool  # a check's verdicts were applied to the router's rotation at least once
    known: tuple[str, ...]  # every replica checked, ROUTER_WORKERS first
    refused: tuple[Refusal, ...]


def _refusal(verdict: Verdict) -> Refusal:
    differences = tuple((d.field, d.here, d.fleet) for d in verdict.differences)
    return Refusal(verdict.url, verdict.detail, differences)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(state: FleetState) -> str:
    """Prometheus text: one gauge per replica, 1 while the watch holds it out of rotation."""
    refused = {refusal.worker for refusal in state.refused}
    lines = [
        f"# HELP {REFUSED_METRIC} 1 while the router's fleet watch keeps this replica out of "
        "rotation (another model or other settings than most replicas, or not comparable), "
        "else 0",
        f"# TYPE {REFUSED_METRIC} gauge",
    ]
    lines += [
        f'{REFUSED_METRIC}{{worker="{_label(url)}"}} {int(url in refused)}' for url in state.known
    ]
    return "\n".join(lines) + "\n"


def _stderr(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


class FleetWatch:
    def __init__(
        self,
        admin_url: str,
        workers: Sequence[str],
        key: str,
        every_s: float,
        log: Callable[[str], None] = _stderr,
    ) -> None:
        self.admin_url, self.workers, self.key = admin_url, tuple(workers), key
        self.every_s, self.log = every_s, log
        self.state = FleetState(applied=False, known=self.workers, refused=())
        self._held: dict[str, Refusal] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleet-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(DEFAULT_TIMEOUT_S * 2)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.check_once()
            except (OSError, ValueError, KeyError) as error:
                # before the first check the router is still starting: quiet, and soon again
                if self.state.applied:
                    self.log(f"fleet check failed, rotation unchanged: {error}")
            self._stopping.wait(self.every_s if self.state.applied else RETRY_S)

    def check_once(self) -> None:
        """One check, applied: OSError when the router's admin route does not answer."""
        rotation = admin.in_rotation(self.admin_url)
        urls = list(dict.fromkeys([*self.workers, *rotation, *self._held]))
        for verdict in check_fleet(urls, self.key):
            self._apply(verdict, rotation)
        self.state = FleetState(True, tuple(urls), tuple(self._held.values()))

    def _apply(self, verdict: Verdict, rotation: list[str]) -> None:
        url = verdict.url
        if verdict.out_of_reach:
            return  # the router's health checks and circuit decide (see the module's text)
        if not verdict.ok:
            refusal = _refusal(verdict)
            if url in rotation:
                status, text = admin.remove(self.admin_url, url)
                if status != 200:
                    self.log(f"could not take {url} out of rotation: HTTP {status} {text}")
                    return
                self.log(f"{url} taken out of rotation: {verdict.detail}")
                self._held[url] = refusal
            elif url in self._held and self._held[url] != refusal:
                self.log(f"{url} kept out of rotation: {verdict.detail}")
                self._held[url] = refusal
            return
        if url not in self._held:
            return
        if url not in rotation:
            status, text = admin.add(self.admin_url, url)
            if status != 200:
                self.log(f"could not put {url} back into rotation: HTTP {status} {text.strip()}")
                return
        del self._held[url]
        self.log(f"{url} back in rotation: it serves what the fleet serves ({verdict.detail})")
