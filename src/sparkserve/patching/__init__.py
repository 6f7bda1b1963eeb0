"""Build-time source patches for the vLLM releases that need them."""

from sparkserve.patching.engine import Finding, Patch, PatchError, PatchInfo, State
from sparkserve.patching.prefix_align import PREFIX_ALIGN
from sparkserve.patching.startup_stop import STARTUP_STOP

ALL_PATCHES: dict[str, Patch] = {patch.info.name: patch for patch in (PREFIX_ALIGN, STARTUP_STOP)}

__all__ = [
    "ALL_PATCHES",
    "PREFIX_ALIGN",
    "STARTUP_STOP",
    "Finding",
    "Patch",
    "PatchError",
    "PatchInfo",
    "State",
]
