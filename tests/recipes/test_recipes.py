"""Recipes (recipes/*.toml): each one, on its shipped geometry, through the launcher's DRY_RUN
command, vLLM's own parser and engine config, and `sparkserve plan` on a Spark; a recipe that
would not fit, an unknown name or a malformed file is refused in one line and nothing starts.
A new recipe file is picked up here with no code change."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.knobs.registry import BY_NAME
from sparkserve.recipes import parse
from support.cpu_launch import LAUNCHERS
from support.geometry import write_word_tokenizer
from support.launcher_runs import CHECKER, dry_run_argv, launcher_env, run_launcher, sentinel_bin

REPO = Path(__file__).resolve().parents[2]
RECIPES = {path.stem: parse(path) for path in sorted((REPO / "recipes").glob("*.toml"))}
PAIRS = [(name, launcher) for name, recipe in RECIPES.items() for launcher in recipe.launchers]
SPARK_OS_RESERVE_GIB = 14.0

__all__ = ["sentinel_bin"]  # a fixture (support.launcher_runs) these tests use


def sparkserve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sparkserve", *args],
        env=env or launcher_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def geometry(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each recipe's shipped geometry, plus a word tokenizer the parsers can start with."""
    root = tmp_path_factory.mktemp("recipe-geometry")
    copies = {}
    for name, recipe in RECIPES.items():
        copies[name] = Path(shutil.copytree(recipe.geometry, root / name))
        write_word_tokenizer(copies[name])
    return copies


@pytest.fixture(scope="module")
def engine_configs(geometry: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    cases = {}
    for name, launcher in PAIRS:
        knobs = {"RECIPE": name, "MODEL": str(geometry[name])}
        if launcher == "dflash":
            knobs["DRAFT_MODEL"] = str(geometry[name] / "drafter")
        cases[f"{name}/{launcher}"] = dry_run_argv(launcher, launcher_env(**knobs))
    work = tmp_path_factory.mktemp("recipe-engine")
    (work / "in.json").write_text(json.dumps(cases))
    done = subprocess.run(
        [sys.executable, str(CHECKER), str(work / "in.json"), str(work / "out.json")],
        env=launcher_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return json.loads((work / "out.json").read_text())


@pytest.mark.parametrize(("name", "launcher"), PAIRS, ids=[f"{n}/{lr}" for n, lr in PAIRS])
def test_vllm_builds_the_engine_config_of_every_recipe(
    name: str, launcher: str, engine_configs: dict, geometry: dict[str, Path]
) -> None:
    result = engine_configs[f"{name}/{launcher}"]
    assert result["ok"], result.get("error")
    knobs = RECIPES[name].knobs_for(launcher)  # type: ignore[arg-type]
    config = json.loads((geometry[name] / "config.json").read_text())
    assert result["model"] == str(geometry[name])
    assert result["architecture"] == config["architectures"][0]
    assert result["served_model_name"] == knobs["SERVED_MODEL_NAME"]
    assert result["max_model_len"] == int(knobs["MAX_MODEL_LEN"])
    assert result["max_num_seqs"] == int(knobs["MAX_NUM_SEQS"])
    assert result["max_num_batched_tokens"] == int(knobs["MAX_BATCHED_TOKENS"])
    assert result["gpu_memory_utilization"] == float(knobs["GPU_MEM"])
    assert result["speculative_method"] == launcher
    assert result["num_speculative_tokens"] == int(knobs["NUM_SPEC_TOKENS"])
    assert result["tool_call_parser"] == (knobs["TOOL_PARSER"] or None)
    assert result["reasoning_parser"] == knobs["REASONING_PARSER"]
    if launcher == "dflash":
        assert result["draft_model"] == str(geometry[name] / "drafter")
        assert result["draft_architecture"] == "DFlashDraftModel"


def test_every_recipe_fits_a_spark_and_keeps_the_os_reserve() -> None:
    done = sparkserve("recipes", "--json")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    summaries = {(s["recipe"], s["launcher"]): s for s in json.loads(done.stdout)}
    assert sorted(summaries) == sorted(PAIRS)
    for pair, summary in summaries.items():
        print(pair, {k: summary[k] for k in ("pool_tokens", "concurrency", "os_left_gib")})
        assert summary["fits"] is True, (pair, summary["verdict"])
        assert summary["os_left_gib"] >= SPARK_OS_RESERVE_GIB
        assert summary["concurrency"] >= 1, "holds one request of the recipe's context"
        assert summary["weights_gib"] == pytest.approx(
            RECIPES[pair[0]].weights_gib
            + (RECIPES[pair[0]].drafter_weights_gib if pair[1] == "dflash" else 0)
        )


def test_the_default_recipe_is_the_registry_defaults() -> None:
    default = RECIPES[BY_NAME["RECIPE"].default]
    for launcher in default.launchers:
        for name, value in default.knobs_for(launcher).items():
            assert value == BY_NAME[name].default_for(launcher), (launcher, name)


def test_the_readme_table_matches_the_recipe_files() -> None:
    done = sparkserve("recipes", "sync", "--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_knob_set_by_the_user_overrides_the_recipe() -> None:
    env = launcher_env(RECIPE="qwen3-coder-next-fp8", MAX_NUM_SEQS="7", DRY_RUN="1")
    argv = dry_run_argv("mtp", env)
    assert argv[argv.index("--max-num-seqs") + 1] == "7"
    assert argv[argv.index("--model") + 1] == "Qwen/Qwen3-Coder-Next-FP8"
    assert argv[argv.index("--tool-call-parser") + 1] == "qwen3_coder"
    assert "--reasoning-parser" not in argv
    off = dry_run_argv("mtp", {**env, "TOOL_PARSER": ""})
    assert "--tool-call-parser" not in off


def test_show_prints_the_knobs_the_launcher_resolves() -> None:
    done = sparkserve("recipes", "show", "qwen3.6-35b-a3b")
    assert done.returncode == 0, done.stderr
    assert "export MODEL='Qwen/Qwen3.6-35B-A3B'" in done.stdout
    assert "export NUM_SPEC_TOKENS='2'" in done.stdout
    assert "# source: https://" in done.stdout


# ---------------------------------------------------------------- refusals

BASE = "qwen3.6-35b-a3b"  # a real recipe the bad ones are made from


def broken_recipes(tmp_path: Path, name: str, text: str, geometry: bool = True) -> Path:
    directory = tmp_path / "recipes"
    directory.mkdir(exist_ok=True)
    (directory / f"{name}.toml").write_text(text)
    if geometry:
        shutil.copytree(REPO / "recipes" / BASE, directory / name)
    return directory


def refused(
    launcher: str, knobs: dict[str, str], sentinel: tuple[Path, Path], directory: Path | None
) -> str:
    bin_dir, marker = sentinel
    env = launcher_env(**knobs)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    if directory is not None:
        env["SPARKSERVE_RECIPES"] = str(directory)
    done = run_launcher(launcher, env)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{LAUNCHERS[launcher].name}: ")
    assert not marker.exists(), "vLLM must not start"
    return lines[0]


def test_unknown_recipe_is_one_line_and_nothing_starts(sentinel_bin: tuple[Path, Path]) -> None:
    line = refused("mtp", {"RECIPE": "no-such-model"}, sentinel_bin, None)
    assert "RECIPE='no-such-model': no such recipe; one of " in line
    assert all(name in line for name in RECIPES)


def test_recipe_for_the_other_launcher_is_refused(sentinel_bin: tuple[Path, Path]) -> None:
    line = refused("dflash", {"RECIPE": "qwen3-coder-next-fp8"}, sentinel_bin, None)
    assert "serves with mtp_serve.sh, not serve.sh" in line


def test_recipe_that_does_not_fit_is_refused_before_start(
    sentinel_bin: tuple[Path, Path], tmp_path: Path
) -> None:
    text = (REPO / "recipes" / f"{BASE}.toml").read_text()
    huge = text.replace("weights_gib = 65.2", "weights_gib = 900")
    assert huge != text
    directory = broken_recipes(tmp_path, "huge", huge)
    line = refused("mtp", {"RECIPE": "huge"}, sentinel_bin, directory)
    assert "RECIPE=huge: its weights (900.0 GiB)" in line and "no room for a KV cache" in line
    env = launcher_env(SPARKSERVE_RECIPES=str(directory))
    done = sparkserve("recipes", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "does not fit" in done.stdout


def _edit(old: str, new: str) -> str:
    text = (REPO / "recipes" / f"{BASE}.toml").read_text()
    assert old in text
    return text.replace(old, new, 1)


MALFORMED = {
    "not-toml": (_edit("[knobs]", "[knobs"), "not valid TOML"),
    "no-weights": (_edit("weights_gib = 65.2", ""), "missing weights_gib"),
    "secret-knob": (_edit("[knobs]", "[knobs]\nAPI_KEY = 'x'"), "knob 'API_KEY' cannot be set"),
    "bad-value": (_edit("GPU_MEM = 0.82", "GPU_MEM = 2"), "GPU_MEM='2': must be a number"),
    "bad-launcher": (_edit('launchers = ["mtp"]', 'launchers = ["ngram"]'), "launchers = "),
    "typo-field": (_edit("title =", "titel = 'x'\ntitle ="), "unknown field(s) titel"),
    "dflash-no-drafter": (
        _edit('launchers = ["mtp"]', 'launchers = ["mtp", "dflash"]'),
        "serves with dflash but sets no DRAFT_MODEL",
    ),
    "verify-limit": (
        _edit("[knobs]", "[verify]\nhead_max_delta = 0\n\n[knobs]"),
        "[verify]: head_max_delta = 0: must be a number above 0, at most 10",
    ),
    "verify-unknown": (
        _edit("[knobs]", "[verify]\nagreement = 0.9\n\n[knobs]"),
        "[verify]: unknown limit 'agreement'; one of head_max_delta, numeric_tie",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_recipe_is_one_line_and_nothing_starts(
    case: str, sentinel_bin: tuple[Path, Path], tmp_path: Path
) -> None:
    text, expected = MALFORMED[case]
    directory = broken_recipes(tmp_path, case, text)
    line = refused("mtp", {"RECIPE": case}, sentinel_bin, directory)
    assert f"{directory / case}.toml" in line and expected in line, line


def test_recipe_without_its_geometry_is_refused(
    sentinel_bin: tuple[Path, Path], tmp_path: Path
) -> None:
    text = (REPO / "recipes" / f"{BASE}.toml").read_text()
    directory = broken_recipes(tmp_path, "no-geometry", text, geometry=False)
    line = refused("mtp", {"RECIPE": "no-geometry"}, sentinel_bin, directory)
    assert "no-geometry/config.json (the model's geometry" in line


def test_the_image_carries_the_recipes_where_the_package_looks() -> None:
    from sparkserve.recipes import IMAGE_DIR

    dockerfile = (REPO / "Dockerfile").read_text()
    assert "WORKDIR /opt/sparkserve" in dockerfile
    assert "COPY recipes ./recipes" in dockerfile
    assert IMAGE_DIR.as_posix() == "/opt/sparkserve/recipes"


def test_without_recipe_files_the_default_is_the_registry_and_a_pick_is_refused(
    sentinel_bin: tuple[Path, Path], tmp_path: Path
) -> None:
    empty = tmp_path / "none"
    empty.mkdir()
    argv = dry_run_argv("dflash", launcher_env(SPARKSERVE_RECIPES=str(empty)))
    assert argv[argv.index("--model") + 1] == BY_NAME["MODEL"].default
    line = refused("mtp", {"RECIPE": BASE}, sentinel_bin, empty)
    assert f"RECIPE='{BASE}': no such recipe; {empty} holds none" in line
