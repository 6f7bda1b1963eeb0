"""Running serve.sh and mtp_serve.sh from the tests: the environment a launcher test starts
from, a run, the DRY_RUN argv, and a fake `vllm` that proves nothing started. Shared by
tests/launch and tests/recipes."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from sparkserve.knobs.registry import KNOBS
from support.cpu_launch import LAUNCHERS

REPO = Path(__file__).resolve().parents[2]
# vLLM's own parser over a launcher's argv: prints the engine configuration it builds
CHECKER = REPO / "tests" / "scenarios" / "engine_config_check.py"


def launcher_env(**knobs: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {knob.name for knob in KNOBS}}
    env.update(
        PYTHONPATH=f"{REPO / 'src'}:{env.get('PYTHONPATH', '')}",
        OS_RESERVE_GB="4",  # the test machine has 24 GiB, not a Spark's 119.7 GiB
        HF_OFFLINE="1",  # the fetch step never calls the Hub
        VLLM_TARGET_DEVICE="cpu",
        HOST="127.0.0.1",  # a run on the host binds HOST itself: beyond loopback needs API_KEY
    )
    env.update(knobs)
    return env


def run_launcher(launcher: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LAUNCHERS[launcher])], env=env, capture_output=True, text=True, timeout=120
    )


def dry_run_argv(launcher: str, env: dict[str, str]) -> list[str]:
    done = run_launcher(launcher, {**env, "DRY_RUN": "1"})
    assert done.returncode == 0, done.stderr
    command = [line for line in done.stdout.splitlines() if line.startswith("exec: ")]
    assert len(command) == 1, done.stdout
    argv = shlex.split(command[0].removeprefix("exec: "))
    assert argv[:2] == ["vllm", "serve"]
    return argv[2:]


@pytest.fixture()
def sentinel_bin(tmp_path: Path) -> tuple[Path, Path]:
    """A fake `vllm` first on PATH: it records that it ran, so we can prove nothing started."""
    bin_dir, marker = tmp_path / "bin", tmp_path / "vllm-ran"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(
        f'#!/bin/sh\necho "$$" > {marker}\nprintf "%s\\n" "$@" > {marker}.argv\n'
        f'env > {marker}.env\necho "$PPID" > {marker}.ppid\n'
    )
    fake.chmod(0o755)
    return bin_dir, marker
