"""Build-time source patches for the vLLM releases that need them."""

from sparkserve.patching.engine import Finding, Patch, PatchError, PatchInfo, State
from sparkserve.patching.prefix_align import PREFIX_ALIGN

ALL_PATCHES: dict[str, Patch] = {PREFIX_ALIGN.info.name: PREFIX_ALIGN}

__all__ = ["ALL_PATCHES", "PREFIX_ALIGN", "Finding", "Patch", "PatchError", "PatchInfo", "State"]
