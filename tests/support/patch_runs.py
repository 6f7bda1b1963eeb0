"""`sparkserve patch NAME` run as a user runs it, and private copies of a vllm package for a
patch to write (hard links: the patch's atomic rename breaks the link of the one file it
writes, so the installed tree stays as it was)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def sparkserve_patch(name: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkserve", "patch", name, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
    )


def copy_of(package: Path, tmp_path: Path) -> Path:
    """A hard-linked copy of the vllm package folder `package`; returns the folder holding it."""
    copy = tmp_path / "site-packages"
    shutil.copytree(package, copy / "vllm", copy_function=os.link)
    return copy


def release_copy(tmp_path: Path) -> Path:
    """A copy of the release under test's vllm package (the one importable here); skips the
    test where none is installed."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the pinned vLLM is not installed: run through ./scripts/test.sh")
    return copy_of(Path(next(iter(spec.submodule_search_locations))), tmp_path)


def check_says_needed(name: str, site: Path, release: str) -> None:
    """`--check` on the copy in `site`: exit 1, "needed: NAME", naming the release."""
    check = sparkserve_patch(name, "--vllm-root", site, "--check")
    assert check.returncode == 1, check
    assert check.stdout.startswith(f"needed: {name}")
    assert f"vLLM {release}" in check.stdout
