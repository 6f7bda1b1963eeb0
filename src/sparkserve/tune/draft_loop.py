"""`sparkserve tune draft`'s loop: the workload served at each draft length (NUM_SPEC_TOKENS),
the fastest recommended and the server left running with it; interrupted, the starting
length comes back."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from sparkserve.server.restarts import Restarter, progress_line

KNOB = "NUM_SPEC_TOKENS"  # the knob this loop changes


def run_draft_loop(
    restarts: Restarter,
    lengths: Sequence[int],
    refused: dict[int, str],
    measure: Callable[[], dict[str, Any]],
    measure_s: float,
    default_restart_s: float,
    say: Callable[[str], None],
) -> tuple[list[dict[str, Any]], int | None]:
    """One row per length, and the fastest length (None: none measured)."""
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    # The running length first: it needs no restart.
    order = sorted(lengths, key=lambda n: str(n) != restarts.running(KNOB))
    try:
        for index, length in enumerate(order, 1):
            label = f"[tune] {index}/{len(order)} NUM_SPEC_TOKENS={length}"
            if length in refused:
                say(f"{label}: not started: {refused[length]}")
                rows.append({"length": length, "refused": refused[length], "tok_s": None})
                continue
            took = restarts.serve({KNOB: str(length)}, f"candidate {index} of {len(order)}")
            say(f"{label}: measuring")
            row = {"length": length, "refused": None, "restart_s": took, **measure()}
            rows.append(row)
            say(
                progress_line(
                    index,
                    len(order),
                    started,
                    restarts.restart_estimate_s(default_restart_s),
                    measure_s,
                )
            )
        measured = [r for r in rows if r.get("tok_s")]
        best = max(measured, key=lambda r: r["tok_s"])["length"] if measured else None
        if best is not None:
            restarts.serve({KNOB: str(best)}, "the fastest")
    except BaseException:
        restarts.restore()
        raise
    if best is None:
        restarts.restore()
    rows.sort(key=lambda r: r["length"])
    return rows, best
