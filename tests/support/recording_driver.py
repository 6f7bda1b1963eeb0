"""A restart driver that records what it was asked (the real drivers, launcher and compose,
are tested against real servers in tests/e2e)."""

from __future__ import annotations

from collections.abc import Mapping


class Recording:
    """A driver that records restarts (the real ones are tested in tests/e2e)."""

    def __init__(self, knobs: dict[str, str]) -> None:
        self._knobs = knobs
        self.restarts: list[dict[str, str | None]] = []

    def knobs(self) -> dict[str, str]:
        return dict(self._knobs)

    def restart(self, changes: Mapping[str, str | None], timeout_s: float) -> float:
        self.restarts.append(dict(changes))
        return 1.0

    def guard_stop(self, hf_home: str, since_epoch: float) -> str | None:
        return None
