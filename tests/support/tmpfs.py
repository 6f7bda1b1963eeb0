"""A tiny tmpfs for a test that needs a full disk: a real ENOSPC, not a mocked one."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tiny_tmpfs(where: Path, size: str = "64k") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` for the `with` block (root only: the suite runs as
    root, as CI does; elsewhere the test skips, saying why)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", f"sparkserve-{uuid.uuid4().hex[:6]}",
         str(where)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)
