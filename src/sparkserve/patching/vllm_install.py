"""Find an installed vLLM package and its release without importing it (imports pull in torch)."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from sparkserve.patching.engine import PatchError


@dataclass(frozen=True)
class VllmInstall:
    root: Path  # the package directory: the one holding __init__.py and v1/
    version: str  # "unknown" when neither _version.py nor dist-info says

    def file(self, relative: str) -> Path:
        return self.root / relative


def locate(vllm_root: Path | None) -> VllmInstall:
    """`vllm_root` may be the package directory or the directory that holds it."""
    if vllm_root is None:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise PatchError("no vllm package is importable here; pass --vllm-root PATH")
        root = Path(next(iter(spec.submodule_search_locations)))
    elif (vllm_root / "vllm" / "__init__.py").is_file():
        root = vllm_root / "vllm"
    elif (vllm_root / "__init__.py").is_file():
        root = vllm_root
    else:
        raise PatchError(
            f"--vllm-root {vllm_root}: no vllm package there "
            "(expected PATH/__init__.py or PATH/vllm/__init__.py)"
        )
    return VllmInstall(root=root.resolve(), version=_read_version(root))


def _read_version(root: Path) -> str:
    version_file = root / "_version.py"
    if version_file.is_file():
        match = re.search(r"""version\s*=\s*['"]([^'"]+)['"]""", version_file.read_text())
        if match:
            return match.group(1)
    for metadata in sorted(root.parent.glob("vllm*.dist-info/METADATA")):
        match = re.search(r"^Version:\s*(\S+)", metadata.read_text(), re.MULTILINE)
        if match:
            return match.group(1)
    return "unknown"
