"""What a node runs, so that the two nodes of a pair can check they run the same thing.

vLLM's multi-node engine assumes both machines run the same code; a pair started from two
different images fails in ways that name neither image. Each node describes itself with
`node_identity()` and compares the peer's description with `differences()`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
from collections.abc import Mapping
from pathlib import Path

from sparkserve.knobs.registry import IMAGE_ENV
from sparkserve.patching.engine import PatchError
from sparkserve.patching.vllm_install import locate

# The fields that must agree, in the order a mismatch is reported.
FIELDS = ("image", "vllm", "torch", "sparkserve", "python", "machine")


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _package_digest() -> str:
    """A digest of this package's Python sources: two images built from different checkouts
    differ here even when every version number agrees."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def node_identity(env: Mapping[str, str]) -> dict[str, str]:
    """This node's description: every value a string, every key in FIELDS."""
    try:
        vllm = locate(None).version
    except PatchError:
        vllm = "unknown"
    return {
        "image": env.get(IMAGE_ENV, "").strip() or "host",
        "vllm": vllm,
        "torch": _distribution_version("torch"),
        "sparkserve": _package_digest(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def differences(mine: Mapping[str, str], peer: Mapping[str, str]) -> list[str]:
    """One phrase per field that differs, e.g. "vllm: here 0.33.0, peer 0.32.0"."""
    return [
        f"{field}: here {mine.get(field, 'missing')}, peer {peer.get(field, 'missing')}"
        for field in FIELDS
        if mine.get(field) != peer.get(field)
    ]
