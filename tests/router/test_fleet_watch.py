"""The fleet watch of `sparkserve router` (sparkserve.router.watch) with the real vllm-router
and three real vLLM CPU replicas: the router tests' shared pair (tests/router/conftest.py,
alike) and one started here with MAX_MODEL_LEN 2048 against their 4096, named first in
ROUTER_WORKERS (the majority decides, not the order). The odd one is taken out of rotation
before the gate passes on any request and never gets one (its own vLLM request counter stays
at 0 while the others serve), the gate's /health stays 200 and names it with the field and
both values, the router's log says so in one line, and the gate's /metrics (behind the key)
has the gauge at 1 for it and 0 for the others. A replica drained by hand is not put back by
the watch. Last, the odd one restarted on its port with the fleet's settings is put back into
rotation, and the gauge and /health say so."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkserve.client.metrics import parse as parse_metrics
from support import api_calls
from support.cpu_launch import MODEL_NAME
from support.replicas import REPLICA_KEY, Replicas, replica
from support.router_process import RouterProcess
from support.vllm_server import VllmServer, metric_sum, tail

pytestmark = pytest.mark.e2e
KEY = REPLICA_KEY
SUCCESS = "vllm:request_success_total"
REFUSED = "sparkserve_router_replica_refused"
CHECK_S = 1  # ROUTER_FLEET_CHECK_S here: a few checks pass in a few seconds
ODD_WHY = "differs: max_model_len: here 2048, fleet 4096"
GUARD_S = 120.0  # a guard against a hang, not a promise


def call(
    url: str, method: str = "GET", body: Any | None = None, key: str | None = KEY
) -> tuple[int, str]:
    return api_calls.call(url, key, method, body)


def chat() -> dict[str, Any]:
    return api_calls.chat("Which replica answers this?", 4, model=MODEL_NAME)


def successes(replica: VllmServer) -> float:
    status, text = call(replica.base_url + "/metrics")
    assert status == 200, text
    return metric_sum(parse_metrics(text), SUCCESS)


@pytest.fixture(scope="module")
def replicas(
    shared_replicas: Replicas,
    tiny_models: dict[str, str],
    sparkserve_site: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[VllmServer]]:
    """[odd, a, b]: the odd one started here while the shared pair starts (or runs)."""
    odd = replica(tmp_path_factory.mktemp("watch-odd"), tiny_models, sparkserve_site,
                  {"MAX_MODEL_LEN": "2048"})  # fmt: skip
    servers = [odd]
    try:
        odd.start()
        a, b = shared_replicas.get()
        odd.wait_healthy()
        servers = [odd, a, b]
        yield servers
    finally:
        servers[0].stop()  # the odd one, or what replaced it; the pair is the conftest's


@pytest.fixture(scope="module")
def router(
    replicas: list[VllmServer], sparkserve_site: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RouterProcess]:
    started = RouterProcess(
        tmp_path_factory.mktemp("watch-router"), sparkserve_site,
        [server.base_url for server in replicas],
        API_KEY=KEY, ROUTER_FLEET_CHECK_S=str(CHECK_S), ROUTER_HEALTH_INTERVAL_S="1",
        # round_robin: without the watch every third request would go to the odd replica
        ROUTER_POLICY="round_robin",
    )  # fmt: skip
    with started.running():
        yield started


def rotation(router: RouterProcess) -> list[str]:
    done = router.admin("workers")
    assert done.returncode == 0, done.stderr
    return sorted(worker["url"] for worker in json.loads(done.stdout))


def health(router: RouterProcess) -> tuple[int, dict[str, Any]]:
    status, text = call(router.url + "/health", key=None)
    return status, json.loads(text)


def gauges(router: RouterProcess) -> dict[str, float]:
    status, text = call(router.url + "/metrics")
    assert status == 200, text
    return {
        dict(labels)["worker"]: value
        for (name, labels), value in parse_metrics(text).items()
        if name == REFUSED
    }


def wait_for(what: str, check: Any, router: RouterProcess) -> None:
    deadline = time.monotonic() + GUARD_S
    while not check():
        assert time.monotonic() < deadline, f"not {what} in {GUARD_S:.0f} s\n{tail(router.log)}"
        time.sleep(0.3)


def test_the_odd_replica_never_gets_a_request(
    router: RouterProcess, replicas: list[VllmServer]
) -> None:
    _, a, b = replicas
    assert rotation(router) == sorted([a.base_url, b.base_url])
    before = [successes(server) for server in replicas]
    for _ in range(6):
        status, text = call(router.url + "/v1/chat/completions", "POST", chat())
        assert status == 200, text
    after = [successes(server) for server in replicas]
    assert after[0] == before[0] == 0, "the odd replica served a request"
    assert after[1] + after[2] - before[1] - before[2] == 6


def test_health_names_the_odd_replica_with_the_field_and_both_values(
    router: RouterProcess, replicas: list[VllmServer]
) -> None:
    odd = replicas[0]
    status, body = health(router)
    assert status == 200, body
    assert body == {
        "status": "ok",
        "refused": [
            {
                "worker": odd.base_url,
                "why": ODD_WHY,
                "differences": [{"field": "max_model_len", "here": "2048", "fleet": "4096"}],
            }
        ],
    }
    lines = [line for line in tail(router.log, 400).splitlines() if odd.base_url in line]
    assert f"sparkserve router: {odd.base_url} taken out of rotation: {ODD_WHY}" in lines, lines


def test_the_gauge_is_1_for_the_odd_replica_and_0_for_the_others(
    router: RouterProcess, replicas: list[VllmServer]
) -> None:
    odd, a, b = replicas
    assert gauges(router) == {odd.base_url: 1.0, a.base_url: 0.0, b.base_url: 0.0}
    for key in (None, "wrong-key"):
        assert call(router.url + "/metrics", key=key)[0] == 401, "the gauge wants the key"


def test_a_replica_drained_by_hand_is_not_put_back(
    router: RouterProcess, replicas: list[VllmServer]
) -> None:
    _, a, b = replicas
    assert router.admin("drain", a.base_url).returncode == 0
    try:
        time.sleep(CHECK_S * 4)  # a few checks find it alike: it stays out all the same
        assert rotation(router) == [b.base_url]
        assert gauges(router)[a.base_url] == 0.0
    finally:
        assert router.admin("add", a.base_url).returncode == 0
    assert rotation(router) == sorted([a.base_url, b.base_url])


def test_restarted_with_the_fleets_settings_it_is_put_back(
    router: RouterProcess,
    replicas: list[VllmServer],
    tiny_models: dict[str, str],
    sparkserve_site: Path,
    tmp_path: Path,
) -> None:
    """Last: it replaces the odd replica by one alike on the same port."""
    odd = replicas[0]
    odd.stop()
    alike = replica(tmp_path, tiny_models, sparkserve_site, {"PORT": str(odd.port)})
    replicas[0] = alike  # the module's fixture stops it
    alike.start().wait_healthy()
    wait_for("back in rotation", lambda: alike.base_url in rotation(router), router)
    assert rotation(router) == sorted(server.base_url for server in replicas)
    assert health(router) == (200, {"status": "ok", "refused": []})
    assert set(gauges(router).values()) == {0.0}
    back = f"sparkserve router: {alike.base_url} back in rotation: it serves what the fleet serves"
    assert back in tail(router.log, 400)
