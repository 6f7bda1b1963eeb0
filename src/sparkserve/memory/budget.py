"""The two memory rules every tool applies alike.

- The budget: vLLM's share of unified memory (GPU_MEM of the total) must leave OS_RESERVE_GB
  to the OS. One predicate, `leaves_reserve`; the launcher's refusal, `sparkserve plan`'s
  "largest GPU_MEM" and doctor's budget row are all built from it, so they agree at every
  boundary.
- The fit: the weights and vLLM's other memory must leave room for a KV cache inside that
  share (`fit_problem`); a recipe's pre-start check and the plan use it.
"""

from __future__ import annotations

import math

from sparkserve.knobs.registry import BY_NAME
from sparkserve.memory.host import GIB

STEP = 0.01  # GPU_MEM is offered in hundredths
# Assumption: memory vLLM's profile charges besides weights and KV (peak activations at
# MAX_BATCHED_TOKENS, the CUDA context, sampler and CUDA-graph pools). Calibrate it from a
# server log: GPU_MEM x total - "Model loading took W GiB" - "Available KV cache memory: K GiB".
DEFAULT_OVERHEAD_GIB = 3.0
_CEILING = BY_NAME["GPU_MEM"].maximum or 1.0


def share_bytes(gpu_mem: float, total_bytes: int) -> int:
    """vLLM's share of unified memory, as vLLM computes it (GPU_MEM x total)."""
    return int(gpu_mem * total_bytes)


def kv_room_bytes(share: int, weights_bytes: int, overhead_bytes: int) -> int:
    """What the share leaves for the KV cache after the weights and the overhead (may be <= 0)."""
    return share - weights_bytes - overhead_bytes


def fit_problem(share: int, weights_bytes: int, overhead_bytes: int) -> str | None:
    """Why the weights and the overhead leave no KV memory in the share (one line), or None."""
    if kv_room_bytes(share, weights_bytes, overhead_bytes) > 0:
        return None
    return (
        f"its weights ({weights_bytes / GIB:.1f} GiB) and {overhead_bytes / GIB:.1f} GiB of "
        f"overhead do not fit in vLLM's share ({share / GIB:.1f} GiB); no room for a KV cache"
    )


def os_left_bytes(gpu_mem: float, total_bytes: int) -> int:
    """Unified memory outside vLLM's share: what the OS keeps."""
    return total_bytes - share_bytes(gpu_mem, total_bytes)


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


def budget_problem(share: float, reserve: float, total_bytes: int) -> str | None:
    """Why GPU_MEM (`share`) leaves the OS less than OS_RESERVE_GB (`reserve`, GiB) (one
    line), or None when it does not. The arguments are the knobs' typed values."""
    if leaves_reserve(share, reserve, total_bytes):
        return None
    return (
        f"GPU_MEM={share:g}: {share:.2f} of {total_bytes / GIB:.1f} GiB leaves "
        f"{os_left_bytes(share, total_bytes) / GIB:.1f} GiB to the OS, less than "
        f"OS_RESERVE_GB={reserve:g}; the largest GPU_MEM that keeps it is "
        f"{largest_gpu_mem(reserve, total_bytes):.2f}"
    )
