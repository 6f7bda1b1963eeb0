"""The Python locks (requirements/*.lock, scripts/lib/locks.py): each is current with its
inputs, pins every package with its hashes, and the venvs the suite runs in hold exactly
their lock: what floats on PyPI can no longer decide a test's verdict."""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "lib"))
import locks  # noqa: E402


@pytest.fixture
def copy_of_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """locks.py pointed at a copy of the requirements and versions.env."""
    shutil.copytree(REPO / "requirements", tmp_path / "requirements")
    shutil.copy(REPO / "versions.env", tmp_path / "versions.env")
    monkeypatch.setattr(locks, "REPO", tmp_path)
    monkeypatch.setattr(locks, "VERSIONS", tmp_path / "versions.env")
    yield tmp_path


def test_every_lock_is_current_with_its_inputs() -> None:
    assert locks.stale() == [], "a requirement changed without its lock: run scripts/lock.sh"


def test_a_changed_requirement_makes_its_lock_stale(copy_of_inputs: Path) -> None:
    assert locks.stale() == []
    fuzz = copy_of_inputs / "requirements" / "test-api-fuzz.in"
    fuzz.write_text(fuzz.read_text().replace("schemathesis==4.32.5", "schemathesis==4.32.4"))
    assert locks.stale() == ["test-api-fuzz"]


def test_a_changed_release_makes_the_locks_that_pin_it_stale(copy_of_inputs: Path) -> None:
    versions = copy_of_inputs / "versions.env"
    text = versions.read_text()
    release = locks.versions()["VLLM_VERSION"]
    versions.write_text(text.replace(f"VLLM_VERSION={release}", "VLLM_VERSION=9.9.9"))
    assert set(locks.stale()) == {"test-core", "spark-aarch64"}
    assert set(locks.pinning("VLLM_VERSION")) == {"test-core", "spark-aarch64"}  # bump-vllm.sh's


def test_the_next_release_has_a_lock_of_its_own(copy_of_inputs: Path) -> None:
    versions = copy_of_inputs / "versions.env"
    text = versions.read_text()
    release = locks.versions()["VLLM_NEXT_VERSION"]
    versions.write_text(text.replace(f"VLLM_NEXT_VERSION={release}", "VLLM_NEXT_VERSION=9.9.9"))
    assert locks.stale() == ["vllm-next-sources"]


def test_changes_name_each_pin_added_removed_or_moved() -> None:
    """What scripts/bump-vllm.sh prints after re-locking."""
    old = (
        "# head\nTorch==2.13.0 \\\n    --hash=sha256:aa\nflashinfer-python==0.7.2.post1\nsix==1.0\n"
    )
    new = "torch==2.14.0 \\\n    --hash=sha256:bb\nflashinfer_python==0.7.3\nsix==1.0\nuv==0.1\n"
    assert locks.changes(old, new) == [
        "~ flashinfer-python 0.7.2.post1 -> 0.7.3",
        "~ torch 2.13.0 -> 2.14.0",
        "+ uv 0.1",
    ]
    assert locks.changes(new, new) == []
    assert locks.changes(new, "") == [
        "- flashinfer-python 0.7.3",
        "- six 1.0",
        "- torch 2.14.0",
        "- uv 0.1",
    ]


def test_a_comment_in_a_requirement_file_changes_no_lock(copy_of_inputs: Path) -> None:
    core = copy_of_inputs / "requirements" / "test-core.in"
    core.write_text("# a note\n" + core.read_text())
    assert locks.stale() == []


@pytest.mark.parametrize("lock", locks.LOCKS, ids=lambda lock: lock.name)
def test_every_pin_carries_its_hashes(lock: locks.Lock) -> None:
    _, pins = locks.read_pins(lock.path.read_text())
    assert pins, f"{lock.path.name} pins nothing"
    for pin in pins:
        assert "--hash=sha256:" in pin.block, f"{lock.path.name}: {pin.name} has no hash"
    for part in lock.parts:
        for line in locks.requirement_lines(part):
            name = line.split("==")[0]
            assert any(locks.normalize(p.name) == locks.normalize(name) for p in pins), line


def test_the_suite_runs_in_exactly_its_lock() -> None:
    """This process's venv (scripts/test.sh's core venv): the lock, pip's lock, nothing else."""
    if not (Path(sys.prefix) / ".complete").exists():
        pytest.skip("not the cached core venv: run through ./scripts/test.sh")
    assert locks.verify(locks.BY_NAME["test-core"], sys.executable, []) == []


def test_the_cpu_servers_run_in_exactly_their_lock() -> None:
    python = os.environ.get("SPARKSERVE_CPU_PYTHON")
    if not python:
        pytest.skip("SPARKSERVE_CPU_PYTHON is not set: run through ./scripts/test.sh")
    shims = tomllib.loads((REPO / "tests" / "cpu_shims" / "pyproject.toml").read_text())
    listed = locks.verify(
        locks.BY_NAME["cpu-serve"], python,
        [f"vllm=={locks.versions()['VLLM_CPU_VERSION']}",
         f"sparkserve-cpu-shims=={shims['project']['version']}"],
    )  # fmt: skip
    assert listed == []


def test_verify_names_what_differs(tmp_path: Path) -> None:
    """The venv check can fail: a venv with nothing installed lacks every pin of the lock."""
    empty = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(empty)
    problems = locks.verify(locks.BY_NAME["lint"], str(empty / "bin" / "python"), [])
    assert "missing: compose-lint==0.36.2" in problems
    assert any(p.startswith("missing: pip==") for p in problems)
