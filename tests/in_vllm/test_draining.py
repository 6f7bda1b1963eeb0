"""The drain middleware as vLLM's API server runs it (pure ASGI, real SIGTERM to this process):
requests pass until the SIGTERM, then get 503; a stream still open after vLLM's timeout ends
with an error event and `[DONE]` instead of hanging."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from types import SimpleNamespace
from typing import Any

from sparkserve.in_vllm.draining import RefuseWhileDraining

TIMEOUT_S = 0.2  # vLLM's --shutdown-timeout, as the engine client's config holds it


def vllm_app() -> SimpleNamespace:
    config = SimpleNamespace(shutdown_timeout=TIMEOUT_S)
    return SimpleNamespace(state=SimpleNamespace(engine_client=SimpleNamespace(vllm_config=config)))


async def endless_stream(scope: Any, receive: Any, send: Any) -> None:
    """A stream whose engine is gone: one event, then nothing more, ever."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
    await send({"type": "http.response.body", "body": b'data: {"choices": []}\n\n',
                "more_body": True})  # fmt: skip
    await asyncio.Event().wait()


async def call(middleware: RefuseWhileDraining, path: str) -> list[dict]:
    sent: list[dict] = []

    async def receive() -> dict:
        await asyncio.Event().wait()
        return {}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    scope = {"type": "http", "path": path, "app": vllm_app()}
    await asyncio.wait_for(middleware(scope, receive, send), timeout=60)  # a hang guard
    return sent


def test_a_stream_open_past_the_drain_ends_with_an_error_and_new_requests_get_503() -> None:
    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: None)  # stands in for the event loop's handler
    try:
        middleware = RefuseWhileDraining(endless_stream)

        async def scenario() -> tuple[list[dict], list[dict]]:
            stream = asyncio.ensure_future(call(middleware, "/v1/completions"))
            await asyncio.sleep(0.3)  # the stream is open, and the hook in place
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.05)
            refused = await call(middleware, "/v1/chat/completions")
            return await stream, refused

        streamed, refused = asyncio.run(scenario())
    finally:
        signal.signal(signal.SIGTERM, before)
    *_, last = streamed
    assert last["more_body"] is False
    error, done = last["body"].decode().strip().split("\n\n")
    assert json.loads(error.removeprefix("data: "))["error"]["code"] == 503
    assert "SHUTDOWN_TIMEOUT_S=0.2 s" in error and done == "data: [DONE]"
    start, body = refused
    assert start["status"] == 503 and (b"retry-after", b"5") in start["headers"]
    assert "shutting down" in json.loads(body["body"])["error"]["message"]
