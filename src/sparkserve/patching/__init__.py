"""Build-time source patches for the vLLM releases that need them.

ALL_PATCHES are applied to every image (docker/apply-vllm-patches.sh). TRIAL_PATCHES are
built, tested and applied by hand (`sparkserve patch NAME`) or by a GPU check
(benchmarks/gpu/), not by the image, until a run on a GPU backs them (docs/PATCHES.md).
LAYOUT_PATCHES are the image's patches that change vLLM's KV cache layout: the planner plans
with them (sparkserve.memory.patched_vllm), as the image serves with them.
"""

from sparkserve.patching.cpu_conv_layout import CPU_CONV_LAYOUT
from sparkserve.patching.engine import Finding, Patch, PatchError, PatchInfo, State
from sparkserve.patching.page_divide import PAGE_DIVIDE
from sparkserve.patching.prefix_align import PREFIX_ALIGN
from sparkserve.patching.startup_stop import STARTUP_STOP

ALL_PATCHES: dict[str, Patch] = {
    patch.info.name: patch for patch in (PREFIX_ALIGN, STARTUP_STOP, CPU_CONV_LAYOUT, PAGE_DIVIDE)
}
TRIAL_PATCHES: dict[str, Patch] = {}
LAYOUT_PATCHES: tuple[str, ...] = (PAGE_DIVIDE.info.name,)

__all__ = [
    "ALL_PATCHES",
    "CPU_CONV_LAYOUT",
    "LAYOUT_PATCHES",
    "PAGE_DIVIDE",
    "PREFIX_ALIGN",
    "STARTUP_STOP",
    "TRIAL_PATCHES",
    "Finding",
    "Patch",
    "PatchError",
    "PatchInfo",
    "State",
]
