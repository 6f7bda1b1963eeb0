"""The vLLM releases this project pins, read from the repository's versions.env."""

from __future__ import annotations

import re
from pathlib import Path

from sparkserve.launch.dotenv import parse


def read_versions(path: Path) -> dict[str, str]:
    """Parse a KEY=VALUE file (comments and blank lines allowed), as sh would source it."""
    return parse(path.read_text(), str(path))


def parse_release(text: str) -> tuple[int, ...]:
    """'0.27.1' -> (0, 27, 1); local or dev suffixes ('0.33.0+cu130', '0.28.0rc1') are dropped."""
    match = re.match(r"(\d+(?:\.\d+)*)", text.strip())
    if match is None:
        raise ValueError(f"not a release number: {text!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def installed_vllm() -> str:
    """The release of the vLLM this Python would import (read from its files, not imported),
    or "unknown"."""
    from sparkserve.patching.engine import PatchError
    from sparkserve.patching.vllm_install import locate

    try:
        return locate(None).version
    except PatchError:
        return "unknown"
