"""vLLM's planning code as a sparkserve patch leaves it, in this process only.

The planner runs vLLM's own functions. A patch that changes the KV layout (the image's,
sparkserve.patching.LAYOUT_PATCHES, or a trial patch) is planned by compiling the patch's
output of the installed module's source and putting the patched function in the module for
the duration, where the installed vLLM lacks it: vLLM's code, patched exactly as `sparkserve
patch NAME` would write it, nothing on disk changed.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from sparkserve.patching import ALL_PATCHES, TRIAL_PATCHES, Patch, PatchError, State


class PatchNotPlannable(RuntimeError):
    """The patch does not fit the installed vLLM; the message is one line."""


def _module(patch: Patch) -> ModuleType:
    """The installed vLLM module holding the patch's target file (or its former place)."""
    targets = [t for t in (patch.info.target, patch.info.former_target) if t]
    for target in targets:
        name = "vllm." + target.removesuffix(".py").replace("/", ".")
        with contextlib.suppress(ImportError):
            module = importlib.import_module(name)
            if getattr(module, str(getattr(patch, "function", "")), None) is not None:
                return module
    raise PatchNotPlannable(
        f"patch {patch.info.name}: none of {', '.join(targets)} holds "
        f"{getattr(patch, 'function', '?')}() in the installed vLLM"
    )


@contextlib.contextmanager
def patched(names: tuple[str, ...]) -> Iterator[list[str]]:
    """vLLM with the named patches in place while the block runs; yields one note per patch
    (applied here, or already in the installed vLLM)."""
    known = ALL_PATCHES | TRIAL_PATCHES
    restore: list[tuple[ModuleType, str, object]] = []
    notes: list[str] = []
    try:
        for name in names:
            if name not in known:
                raise PatchNotPlannable(f"patch {name!r}: must be one of {', '.join(known)}")
            patch = known[name]
            function = str(getattr(patch, "function", ""))
            module = _module(patch)
            path = Path(str(module.__file__))
            source = path.read_text(encoding="utf-8")
            finding, _ = patch.classify(source)
            if finding.state in (State.APPLIED, State.FIXED_UPSTREAM):
                notes.append(f"{name}: {finding.state.value} in the installed vLLM")
                continue
            if finding.state is State.UNRECOGNISED:
                raise PatchNotPlannable(f"patch {name}: {finding.detail}")
            try:
                text = patch.apply_source(source)
            except PatchError as error:
                raise PatchNotPlannable(str(error)) from None
            namespace = dict(vars(module))  # the module's imports, then its code patched
            exec(compile(text, str(path), "exec"), namespace)
            restore.append((module, function, getattr(module, function)))
            setattr(module, function, namespace[function])
            notes.append(f"{name}: applied in this plan (the installed vLLM is unpatched)")
        yield notes
    finally:
        for module, function, original in reversed(restore):
            setattr(module, function, original)
