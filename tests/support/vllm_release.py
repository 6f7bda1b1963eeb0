"""The vLLM release the version-sensitive tests (marker `release`) run against.

The suite runs on the pinned release (versions.env VLLM_VERSION, the test venv's). Then
tests/releases/test_next_release.py runs the `release` tests again on the next one
(VLLM_NEXT_VERSION) from its Python sources: it names them in SOURCE_ENV and puts them first on
PYTHONPATH, and every process those tests start keeps them there (`pythonpath`)."""

from __future__ import annotations

import os
from pathlib import Path

from sparkserve.launch.versions import read_versions

REPO = Path(__file__).resolve().parents[2]
PINS = read_versions(REPO / "versions.env")
SOURCE_ENV = "SPARKSERVE_VLLM_SRC"


def source() -> Path | None:
    """The folder holding the `vllm` package under test, or None for the test venv's own."""
    value = os.environ.get(SOURCE_ENV)
    return Path(value) if value else None


def release() -> str:
    """The release under test, as versions.env names it."""
    return PINS["VLLM_NEXT_VERSION"] if source() else PINS["VLLM_VERSION"]


def pythonpath(*entries: Path | str) -> str:
    """A PYTHONPATH of `entries` for a process that imports vLLM: the release under test first."""
    first = [str(source())] if source() else []
    return os.pathsep.join([*first, *map(str, entries)])
