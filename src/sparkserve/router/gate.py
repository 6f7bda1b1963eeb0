"""The key gate in front of vllm-router: the only listener `sparkserve router` publishes.

vllm-router, started from its wheel, checks no client key and serves its admin routes
(/add_worker, /remove_worker, /workers, /flush_cache, ...) on the same port as the API
(docs/data/runs/2026-12-06-vllm-router-read.md, sections 1 and 5). So the router listens on
loopback only, and this ASGI app stands in front of it:

- the server's own access rule, the same class (sparkserve.in_vllm.access.RequireKey): the Host
  check (421), MAX_REQUEST_MB (413) and the key (401), compared as each replica compares it;
- then an allow list: the OpenAI routes a chat model serves (ROUTES) and /health; every other
  path is 404 and another method 405, so no admin route is reachable from outside;
- the request, the client's Authorization header with it (each replica checks the key too),
  is passed to the router and its answer streamed back chunk by chunk as it arrives (SSE is not
  buffered); a client that goes away closes the router's request, which the router passes on;
- /health is 200 while the router has at least one replica in rotation (its /readiness), 503
  otherwise: what Docker's healthcheck and a load balancer in front ask. Its JSON body names
  each replica the fleet watch (sparkserve.router.watch) holds out of rotation, and why;
- the fleet watch runs here: until its first check is applied to the rotation, /health is 503
  and no request is passed on, so a replica with other settings never gets one;
- /metrics is the gate's own: one gauge per replica, sparkserve_router_replica_refused, 1
  while the watch holds it out (the router's own metrics are on ROUTER_METRICS_PORT). It
  needs the key like every route but /health, unless METRICS_OPEN=1 (as at each replica: for
  a Prometheus that has no key; it names only the replicas' URLs).

CORS headers the router adds (it allows every origin when given none) are dropped, and a
preflight gets 405: like the server's default, no web page of another origin may call it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator

import httpx

from sparkserve.in_vllm.access import RequireKey
from sparkserve.in_vllm.draining import Receive, Scope, Send
from sparkserve.router.watch import FleetWatch, metrics_text

HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"  # the gate's own gauge, not the router's (never passed on)
METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
READINESS_PATH = "/readiness"  # vllm-router's: 200 while at least one worker is healthy
# path -> method: what a chat model's clients call. Left out on purpose: /v1/responses (its
# stored responses live on one replica, a follow-up can land on another), /tokenize and the
# rest, which the router would pass to one replica it picks without retry.
ROUTES = {
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
    "/v1/models": "GET",
}
KEY_ENV = "API_KEY"
UPSTREAM_ENV = "SPARKSERVE_ROUTER_UPSTREAM"  # the router's loopback base URL
# Not passed on in either direction: hop-by-hop headers (RFC 9110 7.6.1), the Host (the
# router's own), and on answers the CORS grants the router adds.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
     b"trailer", b"transfer-encoding", b"upgrade", b"host"}
)  # fmt: skip
CORS_PREFIX = b"access-control-"


def _error(status: int, message: str, kind: str) -> dict[str, object]:
    """An error in vLLM's own shape (its ErrorResponse), as the replicas answer."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


# Before the fleet watch's first check is applied, /health and every API route answer this:
# a replica with other settings must not get a request while the router starts.
NOT_CHECKED_YET = _error(
    503, "the replicas' settings are not checked yet (the router is starting)", "ServiceUnavailable"
)


async def _answer(
    send: Send, status: int, body: dict[str, object] | str, content_type: bytes = b""
) -> None:
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    kind = content_type or b"application/json"
    headers = [(b"content-type", kind), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class RouterProxy:
    """The allow list and the streaming pass-through to the router at `upstream`."""

    def __init__(self, upstream: str, watch: FleetWatch) -> None:
        self.upstream = upstream.rstrip("/")
        self.watch = watch
        # No read timeout: a long prompt's prefill sends nothing for minutes, and the router
        # bounds each request itself (its --request-timeout-secs).
        timeout = httpx.Timeout(connect=10.0, read=None, write=None, pool=None)
        self.client = httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=None))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        path, method = scope["path"], scope["method"]
        if path == HEALTH_PATH and method in ("GET", "HEAD"):
            await self.health(send)
            return
        if path == METRICS_PATH and method == "GET":
            await _answer(send, 200, metrics_text(self.watch.state), METRICS_TYPE)
            return
        if not self.watch.state.applied and path in ROUTES:
            await _answer(send, 503, NOT_CHECKED_YET)
            return
        wanted = ROUTES.get(path)
        if wanted is None:
            await _answer(send, 404, _error(404, f"no route {path} here", "NotFound"))
        elif method != wanted:
            await _answer(send, 405, _error(405, f"{path} takes {wanted}", "MethodNotAllowed"))
        else:
            await self.forward(scope, receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.watch.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await asyncio.to_thread(self.watch.stop)
                await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def health(self, send: Send) -> None:
        state = self.watch.state
        if not state.applied:
            await _answer(send, 503, NOT_CHECKED_YET)
            return
        refused = [refusal.as_json() for refusal in state.refused]
        try:
            answer = await self.client.get(self.upstream + READINESS_PATH, timeout=5.0)
            ready = answer.status_code == 200
        except httpx.HTTPError:
            ready = False
        if ready:
            await _answer(send, 200, {"status": "ok", "refused": refused})
        else:
            message = "no replica in rotation (or the router is not up)"
            await _answer(send, 503, {**_error(503, message, "ServiceUnavailable"),
                                      "refused": refused})  # fmt: skip

    async def forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (name, value)
            for name, value in scope.get("headers") or ()
            if name.lower() not in HOP_BY_HOP
        ]
        query = scope.get("query_string") or b""
        url = self.upstream + scope["path"] + (f"?{query.decode('latin-1')}" if query else "")
        request = self.client.build_request(
            scope["method"], url, headers=headers, content=_body(receive)
        )
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as error:
            message = f"the router did not answer: {type(error).__name__}"
            await _answer(send, 502, _error(502, message, "BadGateway"))
            return
        try:
            kept = [
                (name, value)
                for name, value in response.headers.raw
                if name.lower() not in HOP_BY_HOP and not name.lower().startswith(CORS_PREFIX)
            ]
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": kept}
            )
            # A client gone mid-stream closes the router's request (which the router passes
            # on): the server sends nothing more to a gone client, so it is watched for.
            gone = asyncio.create_task(_disconnected(receive))
            gone.add_done_callback(lambda _: asyncio.ensure_future(response.aclose()))
            try:
                # raw bytes as the router sent them (its content-encoding and length hold)
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except (httpx.HTTPError, httpx.StreamClosed):
                if not gone.done():
                    raise
            finally:
                gone.cancel()
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (after its body was read)."""
    with contextlib.suppress(Exception):
        while (await receive())["type"] != "http.disconnect":
            pass
        return
    await asyncio.Event().wait()  # receive failed: never report a disconnect that was not seen


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    """The client's body as it arrives (RequireKey counts it against MAX_REQUEST_MB)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


def gate_app(
    upstream: str,
    key: str,
    max_request_mb: float,
    hosts: list[str],
    watch: FleetWatch,
    metrics_open: bool = False,
) -> RequireKey:
    """The whole gate: the server's access rule around the allow list and the pass-through."""
    return RequireKey(
        RouterProxy(upstream, watch),
        keys=[key] if key else [],
        metrics_open=metrics_open,
        max_request_mb=max_request_mb,
        hosts=hosts,
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m sparkserve.router.gate`: run by `sparkserve router`, which checked the knobs;
    the key comes from the environment (API_KEY), never from the command line."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="sparkserve.router.gate")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the router's loopback base URL")
    parser.add_argument("--max-request-mb", type=float, required=True)
    parser.add_argument("--allowed-hosts", default="", help="names besides loopback, or *")
    parser.add_argument("--grace-s", type=int, default=50, help="drain time on SIGTERM")
    parser.add_argument("--workers", default="", help="ROUTER_WORKERS, normalised, by commas")
    parser.add_argument(
        "--fleet-check-s", type=int, required=True, help="the fleet watch's interval (seconds)"
    )
    parser.add_argument(
        "--metrics-open", choices=("0", "1"), default="0",
        help="METRICS_OPEN: 1 serves /metrics without the key",
    )  # fmt: skip
    args = parser.parse_args(argv)
    key = os.environ.get(KEY_ENV, "")
    workers = [url for url in args.workers.split(",") if url]
    watch = FleetWatch(args.upstream, workers, key, args.fleet_check_s)
    app = gate_app(
        args.upstream,
        key,
        args.max_request_mb,
        [name for name in args.allowed_hosts.split(",") if name],
        watch,
        metrics_open=args.metrics_open == "1",
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        lifespan="on",
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=args.grace_s,
        log_level="warning",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
