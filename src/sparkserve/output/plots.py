"""Series as the tools' plots draw them."""

from __future__ import annotations

import math


def nan_for_none(values: list[float | None]) -> list[float]:
    """A series to plot: a position no draft reached is a gap, not a zero."""
    return [math.nan if v is None else v for v in values]
