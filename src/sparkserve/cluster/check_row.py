"""One row of `sparkserve doctor`'s table: what was checked, how it stands, and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# blocker: stops a first run; warn: works, but not as it should; info: worth knowing.
Status = Literal["ok", "info", "warn", "blocker", "skip"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
