"""patch_prefix_align.py against real vLLM sources: the buggy release and the pinned one."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.launch.versions import read_versions
from sparkserve.patching import PREFIX_ALIGN
from support import vllm_release

REPO = Path(__file__).resolve().parents[2]
PATCH_SCRIPT = REPO / "patch_prefix_align.py"
SCENARIO = REPO / "tests" / "scenarios" / "prefix_align_scenario.py"
TARGET = Path("vllm") / PREFIX_ALIGN.info.target
PINS = read_versions(REPO / "versions.env")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_patch(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PATCH_SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def run_scenario(vllm_parent: Path | None, out: Path) -> dict:
    """The design note's layout, built by the vLLM in `vllm_parent` (None: the release under
    test)."""
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    vllm_parent = vllm_parent or vllm_release.source()
    # the release's folder first, then this checkout's package (the scenario uses the planner's
    # CPU-platform step)
    env["PYTHONPATH"] = os.pathsep.join(
        [*([str(vllm_parent)] if vllm_parent else []), str(REPO / "src")]
    )
    done = subprocess.run(
        [sys.executable, str(SCENARIO), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="session")
def buggy_source() -> Path:
    root = os.environ.get("SPARKSERVE_VLLM_BUGGY_SRC")
    if not root:
        pytest.skip("SPARKSERVE_VLLM_BUGGY_SRC is unset: run through ./scripts/test.sh")
    return Path(root)


@pytest.fixture()
def buggy_copy(buggy_source: Path, tmp_path: Path) -> Path:
    """A private copy of the buggy release (hard links: the patch's atomic rename breaks the
    link of the one file it writes, so the cached tree stays pristine)."""
    copy = tmp_path / "site-packages"
    shutil.copytree(buggy_source / "vllm", copy / "vllm", copy_function=os.link)
    return copy


@pytest.fixture(scope="session")
def pinned_root() -> Path:
    """The release under test's package folder (support.vllm_release)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the pinned vLLM is not installed: run through ./scripts/test.sh")
    return Path(next(iter(spec.submodule_search_locations)))


def test_buggy_release_is_the_expected_version(buggy_copy: Path) -> None:
    done = run_patch("--vllm-root", buggy_copy, "--check")
    assert done.returncode == 1, done
    assert done.stdout.startswith("needed: prefix-align")
    assert f"vLLM {PINS['VLLM_BUGGY_VERSION']}" in done.stdout


def test_unpatched_buggy_release_fails_the_design_note_scenario(buggy_copy: Path) -> None:
    result = run_scenario(buggy_copy, buggy_copy.parent / "scenario.json")
    assert result["vllm_version"] == PINS["VLLM_BUGGY_VERSION"]
    assert result["vllm_file"].startswith(str(buggy_copy))
    assert len(result["pages"]) == 1, "all pages must be unified for uniform-page grouping"
    assert ["FullAttentionSpec", 2240] in result["groups"]
    assert ["MambaSpec", 4480] in result["groups"]
    assert result["hash_block_size"] == 4480  # the LCM back-off
    assert result["coordinator"].startswith("AssertionError")
    assert "divisible by hash_block_size" in result["coordinator"]


def test_patch_makes_the_hash_block_the_gcd_and_the_coordinator_builds(buggy_copy: Path) -> None:
    done = run_patch("--vllm-root", buggy_copy)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("applied: prefix-align")
    result = run_scenario(buggy_copy, buggy_copy.parent / "scenario.json")
    assert result["scheduler_block_size"] == 4480
    assert result["hash_block_size"] == 2240
    assert result["coordinator"] == "built"
    assert result["coordinator_hash_block_size"] == 2240


@pytest.mark.release
def test_pinned_release_has_the_fix_and_builds_without_the_patch(
    pinned_root: Path, tmp_path: Path
) -> None:
    target = pinned_root / PREFIX_ALIGN.info.target
    before = sha256(target)
    done = run_patch("--vllm-root", pinned_root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("vLLM already has the fix: prefix-align")
    assert f"vLLM {vllm_release.release()}" in done.stdout
    assert sha256(target) == before
    assert run_patch("--vllm-root", pinned_root, "--check").returncode == 0
    result = run_scenario(None, tmp_path / "scenario.json")
    assert result["vllm_version"] == vllm_release.release()
    assert result["hash_block_size"] == 2240
    assert result["coordinator"] == "built"


def test_two_runs_leave_identical_bytes(buggy_copy: Path) -> None:
    target = buggy_copy / TARGET
    assert run_patch("--vllm-root", buggy_copy).returncode == 0
    once = target.read_bytes()
    again = run_patch("--vllm-root", buggy_copy)
    assert again.returncode == 0
    assert again.stdout.startswith("already applied: prefix-align")
    assert target.read_bytes() == once
    assert run_patch("--vllm-root", buggy_copy, "--check").returncode == 0


def test_revert_restores_the_original_bytes(buggy_copy: Path) -> None:
    target = buggy_copy / TARGET
    original = sha256(target)
    mode = target.stat().st_mode
    assert run_patch("--vllm-root", buggy_copy).returncode == 0
    assert sha256(target) != original
    done = run_patch("--vllm-root", buggy_copy, "--revert")
    assert done.returncode == 0 and done.stdout.startswith("reverted: prefix-align")
    assert sha256(target) == original
    assert target.stat().st_mode == mode
    assert run_patch("--vllm-root", buggy_copy, "--revert").stdout.startswith("not applied")


def test_dry_run_prints_the_diff_and_writes_nothing(buggy_copy: Path) -> None:
    target = buggy_copy / TARGET
    original = sha256(target)
    done = run_patch("--vllm-root", buggy_copy, "--dry-run")
    assert done.returncode == 0
    assert f"--- a/{TARGET}" in done.stdout
    assert '+        and g.kv_cache_spec.mamba_cache_mode != "align"' in done.stdout
    assert "-        and g.kv_cache_spec.block_size != cache_config.block_size" in done.stdout
    assert sha256(target) == original


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "and g.kv_cache_spec.block_size != cache_config.block_size",
            "and g.kv_cache_spec.block_size > cache_config.block_size",
            "expected one back-off",
        ),
        (
            "def resolve_kv_cache_block_sizes(",
            "def resolve_block_sizes(",
            "expected one resolve_kv_cache_block_sizes()",
        ),
        ("    return scheduler_block_size, hash_block_size\n", "    return (\n", "does not parse"),
    ],
)
def test_unrecognised_code_is_left_untouched(
    buggy_copy: Path, old: str, new: str, expected: str
) -> None:
    target = buggy_copy / TARGET
    text = target.read_text()
    assert old in text
    garbled = text.replace(old, new, 1)
    target.unlink()  # a hard link into the cache: never write through it
    target.write_text(garbled)
    done = run_patch("--vllm-root", buggy_copy)
    assert done.returncode == 3
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(target) in lines[0] and expected in lines[0]
    assert target.read_text() == garbled


def test_missing_target_file_is_unrecognised(buggy_copy: Path) -> None:
    (buggy_copy / TARGET).unlink()
    done = run_patch("--vllm-root", buggy_copy)
    assert done.returncode == 3
    assert "file absent" in done.stderr and str(TARGET) in done.stderr


def test_not_a_vllm_root_is_a_clear_error(tmp_path: Path) -> None:
    done = run_patch("--vllm-root", tmp_path)
    assert done.returncode == 4
    assert done.stderr.count("\n") == 1
    assert f"--vllm-root {tmp_path}: no vllm package there" in done.stderr


def test_read_only_site_packages_gives_a_clear_error(buggy_copy: Path) -> None:
    target = buggy_copy / TARGET
    original = sha256(target)
    command = [sys.executable, str(PATCH_SCRIPT), "--vllm-root", str(buggy_copy)]
    if os.geteuid() == 0:  # root ignores permission bits: mount the tree read-only instead
        if shutil.which("unshare") is None:
            pytest.skip("root without unshare(1) cannot make a read-only tree")
        command = [
            "unshare", "--mount", "sh", "-c",
            'mount --bind -o ro "$0" "$0" && exec "$@"', str(buggy_copy), *command,
        ]  # fmt: skip
    else:
        target.parent.chmod(0o555)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    finally:
        target.parent.chmod(0o755)
    assert done.returncode == 4, done
    assert done.stderr.count("\n") == 1
    assert f"cannot write {target}" in done.stderr
    assert "Read-only file system" in done.stderr or "Permission denied" in done.stderr
    assert sha256(target) == original
    assert not list(target.parent.glob(".kv_cache_utils.py.*.tmp"))
