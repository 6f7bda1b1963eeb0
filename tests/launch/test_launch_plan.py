"""The launch plan (sparkserve.launch.launch_plan): the launcher's first step decides the start
once; the second reads that plan and the target's config.json, and nothing else."""

from __future__ import annotations

import json

import pytest

from sparkserve.launch.launch_plan import LaunchPlan
from sparkserve.launch.launcher_exports import command_exports, main_command, resolve_exports
from sparkserve.launch.settings import resolve_settings
from sparkserve.memory.host import GIB
from support.launcher_runs import launcher_env

TOTAL = 24 * GIB


def _plan(**knobs: str) -> str:
    variables = resolve_exports(launcher_env(**knobs), "mtp", TOTAL, pid=4242)
    plan = variables["LAUNCH_PLAN"]
    assert isinstance(plan, str)
    return plan


def test_the_second_step_reads_the_plan_not_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = _plan(MODEL="/models/first", GPU_MEM="0.5", API_KEY="sk-plan", RECIPE="")
    # what the environment says by the time vLLM's command is made does not count
    for name, value in {"MODEL": "/models/second", "GPU_MEM": "0.9", "API_KEY": "sk-env"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("sparkserve.launch.launcher_exports.read_meminfo", None)  # nor memory
    argv = list(command_exports(plan)["VLLM_ARGS"])
    assert argv[argv.index("--model") + 1] == "/models/first"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.5"
    assert "VLLM_API_KEY=sk-plan" in command_exports(plan)["VLLM_ENV"]


def test_a_plan_gives_back_the_settings_it_was_made_from() -> None:
    env = launcher_env(RECIPE="qwen3.6-35b-a3b", KV_CACHE_GB="", DRY_RUN="1")
    settings = resolve_settings(env, "mtp")
    plan = LaunchPlan.from_json(_plan(RECIPE="qwen3.6-35b-a3b", KV_CACHE_GB="", DRY_RUN="1"))
    assert plan.settings() == settings and plan.settings().recipe is not None
    assert plan.total_bytes == TOTAL and plan.launcher == "mtp"


@pytest.mark.parametrize(
    "bad",
    ["", "not json", "[]", '{"schema": 99}', "{}"],
)
def test_an_unreadable_plan_is_one_line_exit_2_and_no_variables(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main_command(bad, "serve.sh") == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("serve.sh: the launch plan on standard input is unreadable")


def test_a_plan_for_other_knobs_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A plan of one launcher handed over as another's (mtp reads no DRAFT_MODEL)."""
    plan = _plan()
    for foreign in (
        plan.replace('"launcher":"mtp"', '"launcher":"dflash"', 1),
        json.dumps({**json.loads(plan), "text": sorted(json.loads(plan)["text"])}),
        plan.replace('"image":"spark"', '"image":"gpu"', 1),
    ):
        assert foreign != plan
        assert main_command(foreign, "serve.sh") == 2
        assert "the launch plan on standard input" in capsys.readouterr().err
