"""`sparkserve plan` run as a user runs it, against the test's vLLM: one command line per
process (`plan_cli`), or several in one process, so that vLLM is imported once (`plan_runs`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.vllm_release import pythonpath

REPO = Path(__file__).resolve().parents[2]


def plan_cli(
    *args: str,
    python: str = sys.executable,
    timeout: int = 300,
    target_device: str | None = "cpu",
    env: dict[str, str] | None = None,
) -> Any:
    """`sparkserve plan ARGS` with the test's environment (no cluster knobs) plus `env`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTER_")}
    env = dict(base, PYTHONPATH=pythonpath(REPO / "src"), **(env or {}))
    env.pop("VLLM_TARGET_DEVICE", None)
    if target_device is not None:
        env["VLLM_TARGET_DEVICE"] = target_device
    return subprocess.run(
        [python, "-m", "sparkserve", "plan", *args],
        capture_output=True, text=True, env=env, timeout=timeout, check=False,
    )  # fmt: skip


# Several `sparkserve plan` command lines in one process: vLLM is imported once.
PLANS = """
import contextlib, io, json, os, sys
from sparkserve.cli import main
results = []
for argv, env in json.loads(sys.argv[1]):
    saved = dict(os.environ)
    os.environ.update(env)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    os.environ.clear()
    os.environ.update(saved)
    results.append([status, out.getvalue(), err.getvalue()])
with open(sys.argv[2], "w") as handle:
    json.dump(results, handle)
"""


def plan_runs(cases: dict[str, tuple[list[str], dict[str, str]]], work: Path) -> dict:
    """Each case's (exit status, stdout, stderr) from `sparkserve plan ARGV` with ENV added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTER_")}
    env |= {"PYTHONPATH": pythonpath(REPO / "src"), "VLLM_TARGET_DEVICE": "cpu"}
    argvs = [[["plan", *argv], extra] for argv, extra in cases.values()]
    done = subprocess.run(
        [sys.executable, "-c", PLANS, json.dumps(argvs), str(work / "plans.json")],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((work / "plans.json").read_text())
    return dict(zip(cases, results, strict=True))
