"""The access middleware on a real Starlette app, driven through ASGI as uvicorn drives it: the
key on every route but the open ones, vLLM's header form, CORS preflights, and 413 for a body
declared or read past the limit, before the app reads it."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from sparkserve.in_vllm.access import (
    METRICS_PATH,
    OPEN_PATHS,
    RequireKey,
    RequireKeyThenDrain,
    host_name,
    open_paths,
)
from sparkserve.in_vllm.draining import RefuseWhileDraining
from sparkserve.knobs.registry import BY_NAME

KEY = "s3cr3t-key"
MIB = 1024 * 1024


async def echo(request: Request) -> Response:
    try:
        body = await request.body()
    except Exception:  # what vLLM's handlers do with a failed read: answer it
        return JSONResponse({"error": "could not read the body"}, status_code=400)
    return JSONResponse({"bytes": len(body)})


async def empty(request: Request) -> Response:
    return PlainTextResponse("")


def app(**options: Any) -> Starlette:
    """vLLM's layout in small: routes, CORS inside, the access middleware outside it."""
    cors = Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"],
                      allow_headers=["*"])  # fmt: skip
    return Starlette(routes=routes(), middleware=[Middleware(RequireKey, **options), cors])


def routes() -> list[Route]:
    return [
        Route("/health", empty),
        Route(METRICS_PATH, empty),
        Route("/version", empty),
        Route("/invocations", echo, methods=["POST"]),
        Route("/v1/completions", echo, methods=["POST"]),
    ]


class Reply:
    def __init__(self, messages: list[dict[str, Any]], chunks_read: int) -> None:
        start = next(m for m in messages if m["type"] == "http.response.start")
        self.status: int = start["status"]
        self.headers = {k.decode(): v.decode() for k, v in start["headers"]}
        self.body = b"".join(
            m.get("body", b"") for m in messages if m["type"] == "http.response.body"
        )
        self.chunks_read = chunks_read

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    asgi: Any,
    path: str,
    method: str = "GET",
    headers: Sequence[tuple[str, Any]] = (),
    chunks: Sequence[bytes] = (),
    root_path: str = "",
) -> Reply:
    """One request: `chunks` is the body as the server hands it over (a chunked upload when
    no Content-Length is among `headers`)."""
    sent: list[dict[str, Any]] = []
    pending = list(chunks)
    read = 0

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not pending:
            return {"type": "http.request", "body": b"", "more_body": False}
        read += 1
        body = pending.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": root_path + path, "raw_path": (root_path + path).encode(),
        "root_path": root_path, "query_string": b"", "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "headers": [(k.lower().encode(), v.encode()) for k, v in with_host(headers)],
    }  # fmt: skip
    asyncio.run(asyncio.wait_for(asgi(scope, receive, send), timeout=60))  # a hang guard
    return Reply(sent, read)


def with_host(headers: Sequence[tuple[str, Any]]) -> list[tuple[str, str]]:
    """The headers, with the Host a client of 127.0.0.1:8000 sends unless one is given
    (`("Host", None)`: none at all)."""
    given = [(k, v) for k, v in headers if k.lower() == "host"]
    rest = [(k, v) for k, v in headers if k.lower() != "host"]
    host = given[0][1] if given else "127.0.0.1:8000"
    return [*([("Host", host)] if host is not None else []), *rest]


def auth(key: str = KEY, scheme: str = "Bearer") -> tuple[str, str]:
    return ("Authorization", f"{scheme} {key}")


def test_the_open_list_is_health_and_metrics_only_by_its_knob() -> None:
    assert OPEN_PATHS == ("/health",)
    assert open_paths(False) == {"/health"}
    assert open_paths(True) == {"/health", "/metrics"}


def test_with_a_key_every_route_but_health_needs_it() -> None:
    guarded = app(keys=[KEY], metrics_open=False, max_request_mb=1)
    for path, method in [("/metrics", "GET"), ("/version", "GET"), ("/invocations", "POST"),
                         ("/v1/completions", "POST"), ("/no/such/route", "GET"),
                         ("/health/", "GET"), ("//health", "GET")]:  # fmt: skip
        reply = call(guarded, path, method, chunks=[b"{}"])
        assert reply.status == 401, (path, method)
        assert reply.json() == {"error": "Unauthorized"}  # vLLM's own answer
        assert reply.headers["www-authenticate"] == "Bearer"
        assert reply.chunks_read == 0, "refused before the body is read"
    assert call(guarded, "/health").status == 200
    reply = call(guarded, "/invocations", "POST", [auth()], chunks=[b"abc"])
    assert (reply.status, reply.json()) == (200, {"bytes": 3})
    bearer = auth(scheme="bearer")  # vLLM takes the scheme in any case
    assert call(guarded, "/version", headers=[bearer]).status == 200
    for wrong in [auth("s3cr3t-kez"), auth(KEY + " "), auth(KEY, "Basic"), ("Authorization", KEY),
                  ("X-Api-Key", KEY)]:  # fmt: skip
        assert call(guarded, "/version", headers=[wrong]).status == 401, wrong


def test_metrics_opens_by_its_knob_and_a_root_path_is_seen_through() -> None:
    assert call(app(keys=[KEY], metrics_open=True), "/metrics").status == 200
    assert call(app(keys=[KEY], metrics_open=True), "/version").status == 401
    assert call(app(keys=[KEY]), "/health", root_path="/api").status == 200


def test_without_a_key_everything_is_open_but_the_limit_holds() -> None:
    open_app = app(keys=[], max_request_mb=1)
    assert call(open_app, "/version").status == 200
    reply = call(open_app, "/v1/completions", "POST", [("Content-Length", str(MIB + 1))])
    assert reply.status == 413 and reply.chunks_read == 0


def test_a_cors_preflight_passes_and_another_options_needs_the_key() -> None:
    guarded = app(keys=[KEY])
    preflight = [("Origin", "http://example.com"), ("Access-Control-Request-Method", "POST")]
    reply = call(guarded, "/v1/completions", "OPTIONS", preflight)
    assert reply.status == 200 and reply.headers["access-control-allow-origin"] == "*"
    assert call(guarded, "/v1/completions", "OPTIONS", [preflight[0]]).status == 401


def test_a_body_declared_too_large_is_refused_before_it_is_read_key_or_not() -> None:
    guarded = app(keys=[KEY], max_request_mb=2)
    too_large = ("Content-Length", str(2 * MIB + 1))
    for path, headers in [("/v1/completions", [too_large]),
                          ("/v1/completions", [too_large, auth()]),
                          ("/health", [too_large])]:  # fmt: skip
        reply = call(guarded, path, "POST", headers, chunks=[b"x" * MIB] * 3)
        assert reply.status == 413 and reply.chunks_read == 0, (path, headers)
        error = reply.json()["error"]
        assert error["code"] == 413 and "MAX_REQUEST_MB=2" in error["message"]
        assert reply.headers["connection"] == "close"
    exactly = [("Content-Length", str(2 * MIB)), auth()]
    reply = call(guarded, "/v1/completions", "POST", exactly, chunks=[b"x" * MIB] * 2)
    assert (reply.status, reply.json()) == (200, {"bytes": 2 * MIB})


def test_a_chunked_body_is_refused_once_it_passes_the_limit() -> None:
    """The app's own answer to the refused read (here a 400, as vLLM's handlers give) is
    replaced by the 413; the rest of the body is never read."""
    guarded = app(keys=[KEY], max_request_mb=2)
    reply = call(guarded, "/v1/completions", "POST", [auth()], chunks=[b"x" * MIB] * 5)
    assert reply.status == 413 and reply.chunks_read == 3
    assert reply.json()["error"]["code"] == 413
    reply = call(guarded, "/v1/completions", "POST", [auth()], chunks=[b"x" * MIB] * 2)
    assert (reply.status, reply.json()) == (200, {"bytes": 2 * MIB})


def test_an_app_that_lets_the_refused_read_raise_gets_413_too() -> None:
    async def raw(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    guarded = RequireKey(raw, keys=[], max_request_mb=1)
    assert call(guarded, "/v1/completions", "POST", chunks=[b"x" * MIB] * 3).status == 413
    assert call(guarded, "/v1/completions", "POST", chunks=[b"x" * MIB]).status == 200


def test_as_vllm_builds_it_the_key_and_knobs_come_from_its_args_and_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM calls app.add_middleware(RequireKey): no options. The key is vLLM's: its
    --api-key values when given, else VLLM_API_KEY; the knobs come from the environment."""
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.delenv("METRICS_OPEN", raising=False)
    monkeypatch.delenv("MAX_REQUEST_MB", raising=False)
    built = app()
    assert call(built, "/metrics").status == 401
    assert call(built, "/metrics", headers=[auth()]).status == 200
    default = int(BY_NAME["MAX_REQUEST_MB"].default) * MIB
    assert call(built, "/health", "POST", [("Content-Length", str(default + 1))]).status == 413
    monkeypatch.setenv("METRICS_OPEN", "1")
    monkeypatch.setenv("MAX_REQUEST_MB", "1")
    built = app()
    assert call(built, "/metrics").status == 200
    assert call(built, "/health", "POST", [("Content-Length", str(MIB + 1))]).status == 413
    built = app()
    built.state.args = SimpleNamespace(api_key=["cli-key-1", "cli-key-2"])  # wins over the env
    assert call(built, "/version", headers=[auth()]).status == 401
    assert call(built, "/version", headers=[auth("cli-key-2")]).status == 200


def test_a_websocket_without_the_key_is_closed_before_it_is_accepted() -> None:
    reached = []

    async def socket_app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(dict(message))

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    guarded = RequireKey(socket_app, keys=[KEY])
    host = (b"host", b"localhost:8000")
    scope = {"type": "websocket", "path": "/v1/realtime", "headers": [host]}
    asyncio.run(guarded(scope, receive, send))
    assert sent == [{"type": "websocket.close", "code": 1008}] and not reached
    scope["headers"] = [(b"authorization", f"Bearer {KEY}".encode())]
    asyncio.run(guarded(scope, receive, send))  # the key, but no Host
    assert not reached
    scope["headers"] = [host, (b"authorization", f"Bearer {KEY}".encode())]
    asyncio.run(guarded(scope, receive, send))
    assert reached == ["/v1/realtime"]
    scope["headers"] = [(b"host", b"rebound.test:8000"), *scope["headers"][1:]]
    asyncio.run(guarded(scope, receive, send))
    assert reached == ["/v1/realtime"], "another name is closed before it is accepted"


def test_the_launchers_one_middleware_checks_the_key_before_the_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RequireKeyThenDrain, as vLLM builds it: a refused request never reaches the drain (its
    SIGTERM hook is set by the first request it sees), an allowed one passes through it."""
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    before = signal.getsignal(signal.SIGTERM)
    try:
        guarded = RequireKeyThenDrain(Starlette(routes=routes()))
        assert isinstance(guarded.app, RefuseWhileDraining)
        assert call(guarded, "/version").status == 401
        assert not guarded.app.hooked
        assert call(guarded, "/version", headers=[auth()]).status == 200
        assert guarded.app.hooked
    finally:
        signal.signal(signal.SIGTERM, before)


ROUTES = [("/health", "GET"), ("/v1/models", "GET"), ("/v1/completions", "POST"),
          ("/no/such/route", "GET")]  # fmt: skip


def test_a_host_that_is_not_loopback_or_allowed_gets_421_on_every_route() -> None:
    """DNS rebinding: the browser sends the page's own name as Host. Refused before the key,
    the body limit or the route: /health too, with a key or not."""
    for keys in ([], [KEY]):
        guarded = app(keys=keys, hosts=["spark.lan", "192.168.1.20"], max_request_mb=1)
        for host in ["rebound.test:8000", "rebound.test", "attacker.example", "127.0.0.1.nip.io",
                     "localhost.attacker.example", "spark.lan.evil", "192.168.1.21:8000",
                     "[::2]:8000", "::1", "a b", "", None]:  # fmt: skip
            for path, method in ROUTES:
                headers = [("Host", host), auth(), ("Content-Length", str(2 * MIB))]
                reply = call(guarded, path, method, headers, chunks=[b"{}"])
                assert reply.status == 421, (keys, host, path)
                assert reply.chunks_read == 0
                error = reply.json()["error"]
                assert error["code"] == 421 and "ALLOWED_HOSTS" in error["message"]
        for host in ["127.0.0.1:8000", "127.0.0.2", "localhost:8000", "LOCALHOST.", "[::1]:8000",
                     "spark.lan:8000", "Spark.LAN.", "192.168.1.20"]:  # fmt: skip
            assert call(guarded, "/health", headers=[("Host", host)]).status == 200, host
            reply = call(guarded, "/version", headers=[("Host", host), auth()])
            assert reply.status == 200, host


def test_any_host_with_a_star_and_loopback_only_without_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    anywhere = app(keys=[], hosts=["*"])
    assert call(anywhere, "/version", headers=[("Host", "x.example")]).status == 200
    monkeypatch.delenv("SPARKSERVE_ALLOWED_HOSTS", raising=False)
    built = app(keys=[])
    assert call(built, "/version", headers=[("Host", "x.example")]).status == 421
    assert call(built, "/version", headers=[("Host", "localhost")]).status == 200
    monkeypatch.setenv("SPARKSERVE_ALLOWED_HOSTS", "x.example,[::5]")
    built = app(keys=[])
    assert call(built, "/version", headers=[("Host", "x.example:1")]).status == 200
    assert call(built, "/version", headers=[("Host", "[::5]:1")]).status == 200
    assert call(built, "/version", headers=[("Host", "y.example")]).status == 421


def test_a_host_header_is_read_as_a_name_without_its_port() -> None:
    assert host_name(b"Rebound.Test.:8000") == "rebound.test"
    assert host_name(b"[::1]:80") == "::1"
    for malformed in [b"x:y", b"::1", b"[::1", b"[::1]x", b"a b", b""]:
        assert host_name(malformed) is None, malformed
