"""`sparkserve doctor --fleet`'s rows: the replicas behind the router (sparkserve.router.fleet),
one row each, after a row that says what was compared."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sparkserve.cluster.check_row import Check
from sparkserve.knobs.registry import BY_NAME, KnobError
from sparkserve.router.fleet import COMPARED, NOT_COMPARED, check_fleet
from sparkserve.router.workers import parse_workers

ALL_CLEAR = "no blockers: every replica answers and serves the same model and settings"


def fleet_workers(given: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The replicas named after --fleet, else ROUTER_WORKERS; KnobError (one line) when a URL
    is bad or there is none."""
    if given:
        try:
            return parse_workers(" ".join(given))
        except ValueError as error:
            raise KnobError(f"--fleet: {error}") from None
    knob = BY_NAME["ROUTER_WORKERS"]
    text = knob.check(env.get(knob.name, ""))  # KnobError naming the knob
    if not text:
        raise KnobError("--fleet: no replica: name their URLs after --fleet or set ROUTER_WORKERS")
    return parse_workers(text)


def fleet_rows(urls: Sequence[str], key: str, timeout_s: float) -> list[Check]:
    """A row saying what was compared, then one per replica: ok, or a blocker saying why."""
    rows = [
        Check(
            "fleet",
            "info",
            f"{len(urls)} replicas, each field against the value most of them have (a tie: the "
            f"earliest's). Compared: {COMPARED}. Not compared: {NOT_COMPARED}",
        )
    ]
    for verdict in check_fleet(urls, key, timeout_s):
        rows.append(Check(verdict.url, "ok" if verdict.ok else "blocker", verdict.detail))
    return rows
