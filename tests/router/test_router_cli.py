"""`sparkserve router`'s refusals before it starts anything (sparkserve.router.cli), run as a
user runs it: one line on stderr, exit 2, no child process."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.knobs.registry import KNOBS

SRC = Path(__file__).resolve().parents[2] / "src"


def sparkserve_router(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in {knob.name for knob in KNOBS}}
    return subprocess.run(
        [sys.executable, "-m", "sparkserve", "router", *args],
        env={**clean, "PYTHONPATH": str(SRC), **env},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.skipif(
    importlib.util.find_spec("vllm_router") is not None, reason="this Python has vllm-router"
)
def test_without_vllm_router_it_says_so_in_one_line() -> None:
    done = sparkserve_router(ROUTER_WORKERS="http://127.0.0.1:9", HOST="127.0.0.1")
    assert done.returncode == 2
    assert done.stderr == (
        f"sparkserve router: vllm-router is not installed for {sys.executable} (the images carry "
        "it: requirements/*.lock pin vllm-router==0.1.17)\n"
    )


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({}, "ROUTER_WORKERS is empty: name each replica"),
        ({"ROUTER_WORKERS": "http://a:8000/v1"}, "ROUTER_WORKERS: worker URL 'http://a:8000/v1': "
         "a path (/v1) is not allowed"),
        ({"ROUTER_WORKERS": "http://a:8000", "HOST": "0.0.0.0"}, "HOST='0.0.0.0' binds the "
         "router beyond this machine without API_KEY"),
        ({"ROUTER_WORKERS": "http://a:8000", "API_KEY": "k", "ROUTER_PORT": "30000"},
         "ROUTER_PORT=30000 is the router's own loopback port"),
    ],
)  # fmt: skip
def test_a_bad_setting_is_one_line_and_exit_2(env: dict[str, str], line: str) -> None:
    done = sparkserve_router(**env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"sparkserve router: {line}")
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def test_the_env_file_is_read_and_the_environment_wins(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("ROUTER_WORKERS=http://a:8000/v1\nROUTER_POLICY=bogus\n")
    done = sparkserve_router("--env-file", str(env_file), ROUTER_WORKERS="http://a:8000")
    assert done.returncode == 2
    assert done.stderr.startswith("sparkserve router: ROUTER_POLICY='bogus': must be one of")


def test_drain_of_a_bad_url_or_with_no_router_is_one_line() -> None:
    done = sparkserve_router("drain", "http://a")
    assert done.returncode == 2
    assert done.stderr.startswith("sparkserve router: worker URL 'http://a': no port")
    done = sparkserve_router("--router-port", "9", "drain", "http://127.0.0.1:8000")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "the router at http://127.0.0.1:9 did not answer" in done.stderr
