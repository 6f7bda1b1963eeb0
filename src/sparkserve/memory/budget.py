"""The GPU_MEM budget rule: vLLM's share of unified memory must leave OS_RESERVE_GB to the OS.

One predicate, `leaves_reserve`; the launcher's refusal, `sparkserve plan`'s "largest GPU_MEM"
and doctor's budget row are all built from it, so they agree at every boundary.
"""

from __future__ import annotations

import math

from sparkserve.knobs import BY_NAME
from sparkserve.memory.host import GIB

STEP = 0.01  # GPU_MEM is offered in hundredths
_CEILING = BY_NAME["GPU_MEM"].maximum or 1.0


def os_left_bytes(gpu_mem: float, total_bytes: int) -> float:
    """Unified memory outside vLLM's share."""
    return (1 - gpu_mem) * total_bytes


def leaves_reserve(gpu_mem: float, reserve_gib: float, total_bytes: int) -> bool:
    return os_left_bytes(gpu_mem, total_bytes) >= reserve_gib * GIB


def largest_gpu_mem(reserve_gib: float, total_bytes: int) -> float:
    """The largest GPU_MEM, in hundredths and within the knob's range, that keeps
    `reserve_gib` for the OS; 0.0 when none does."""
    hundredths = math.floor(max(0.0, min(_CEILING, 1 - reserve_gib * GIB / total_bytes)) * 100)
    # the float arithmetic above may land one step off the predicate either way
    while hundredths < round(_CEILING * 100) and leaves_reserve(
        (hundredths + 1) / 100, reserve_gib, total_bytes
    ):
        hundredths += 1
    while hundredths > 0 and not leaves_reserve(hundredths / 100, reserve_gib, total_bytes):
        hundredths -= 1
    return hundredths / 100


def budget_problem(gpu_mem: str, reserve_gib: str, total_bytes: int) -> str | None:
    """Why GPU_MEM leaves the OS less than OS_RESERVE_GB (one line), or None when it does not.
    The arguments are the knobs' validated values."""
    share, reserve = float(gpu_mem), float(reserve_gib)
    if leaves_reserve(share, reserve, total_bytes):
        return None
    return (
        f"GPU_MEM={gpu_mem}: {share:.2f} of {total_bytes / GIB:.1f} GiB leaves "
        f"{os_left_bytes(share, total_bytes) / GIB:.1f} GiB to the OS, less than "
        f"OS_RESERVE_GB={reserve_gib}; the largest GPU_MEM that keeps it is "
        f"{largest_gpu_mem(reserve, total_bytes):.2f}"
    )
