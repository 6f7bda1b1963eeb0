"""The two replicas that the router tests share: started on first use, stopped after
the last test of the modules that use them (support/replicas.py's ROUTER_REPLICA_MODULES, which
tests/conftest.py runs in one process, one after the other), so that each module does not
start its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.replicas import ROUTER_REPLICA_MODULES, Replicas, replica
from support.vllm_server import VllmServer

SHARED = pytest.StashKey[Replicas]()


@pytest.fixture(scope="session")
def shared_replicas(
    request: pytest.FixtureRequest,
    tiny_models: dict[str, str],
    sparkserve_site: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Replicas]:
    pair = Replicas(
        [replica(tmp_path_factory.mktemp(f"replica-{n}"), tiny_models, sparkserve_site)
         for n in (1, 2)]
    )  # fmt: skip
    request.config.stash[SHARED] = pair
    try:
        yield pair
    finally:
        pair.stop()


@pytest.fixture()
def router_replicas(shared_replicas: Replicas) -> list[VllmServer]:
    """Two alike replicas (support/replicas.py), healthy; a test must leave them as it found
    them (running, nothing in flight)."""
    return shared_replicas.get()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test that may use them: stop them now, not when the process ends."""
    pair = item.config.stash.get(SHARED, None)
    if pair is not None and (
        nextitem is None or not nextitem.nodeid.startswith(ROUTER_REPLICA_MODULES)
    ):
        pair.stop()
