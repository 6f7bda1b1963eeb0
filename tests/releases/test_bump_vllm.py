"""scripts/bump-vllm.sh: a release it refuses leaves versions.env and the locks as they were,
with one line naming the bad value (its run on a real release: docs/UPGRADING.md)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def checkout(tmp_path: Path) -> Path:
    """A git checkout of what the script reads and writes (its scripts, versions.env, the
    requirements), committed, so that the real one is never touched."""
    root = tmp_path / "repo"
    for name in ("scripts", "requirements"):
        shutil.copytree(REPO / name, root / name)
    shutil.copy(REPO / "versions.env", root / "versions.env")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], check=True)
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    files = [root / "versions.env", *sorted((root / "requirements").iterdir())]
    return {p.name: p.read_bytes() for p in files}


def bump(root: Path, *args: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(root / "scripts" / "bump-vllm.sh"), *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["0.34"], "VERSION '0.34': must be a vLLM release number like 0.34.0"),
        (["v0.34.0"], "VERSION 'v0.34.0': must be a vLLM release number"),
        (["0.34.0", "--fast"], "usage: bump-vllm.sh VERSION [--aarch64]"),
        ([], "usage: bump-vllm.sh VERSION [--aarch64]"),
    ],
)
def test_bad_arguments_are_one_line_and_change_nothing(
    checkout: Path, args: list[str], expected: str
) -> None:
    before = snapshot(checkout)
    done = bump(checkout, *args)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr
    assert snapshot(checkout) == before


def test_the_pinned_release_and_unsaved_changes_are_refused(checkout: Path) -> None:
    pinned = (checkout / "versions.env").read_text().split("\nVLLM_VERSION=")[1].split()[0]
    done = bump(checkout, pinned)
    assert done.returncode == 2 and f"vLLM {pinned} is already the pinned release" in done.stderr
    lock = checkout / "requirements" / "test-core.lock"
    lock.write_text(lock.read_text() + "\n")
    before = snapshot(checkout)
    done = bump(checkout, "9.9.9")
    assert done.returncode == 2 and "uncommitted changes" in done.stderr, done.stderr
    assert snapshot(checkout) == before


def test_a_release_that_does_not_resolve_leaves_everything_as_it_was(checkout: Path) -> None:
    """vLLM 0.0.99 does not exist: the lock step fails and versions.env comes back."""
    before = snapshot(checkout)
    done = bump(checkout, "0.0.99", timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "the locks did not resolve for vLLM 0.0.99" in done.stderr, done.stderr[-3000:]
    assert snapshot(checkout) == before
