"""A streamed completion read in a thread, event by event, timed: how it ended is the subject
(a normal end: a finish_reason and `data: [DONE]`; a failed one: an error event, or a cut)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field


@dataclass
class StreamResult:
    status: int = 0
    chunks: int = 0
    tokens: int = 0  # completion tokens the server has sent so far (its continuous usage)
    finish_reasons: list[str] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    done: bool = False  # `data: [DONE]` arrived
    failure: str = ""  # the connection broke (an exception), not an event
    first_chunk_at: float | None = None  # time.monotonic()
    ended_at: float | None = None

    @property
    def finished_normally(self) -> bool:
        return (
            self.status == 200 and self.done and not self.errors and not self.failure
            and bool(self.finish_reasons) and self.finish_reasons[-1] in ("length", "stop")
        )  # fmt: skip


class Stream(threading.Thread):
    def __init__(self, port: int, key: str, model: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.port, self.key, self.model, self.max_tokens = port, key, model, max_tokens
        self.result = StreamResult()

    def run(self) -> None:
        result = self.result
        usage = {"include_usage": True, "continuous_usage_stats": True}  # tokens on every chunk
        body = {"model": self.model, "prompt": "hello", "max_tokens": self.max_tokens,
                "stream": True, "ignore_eos": True, "temperature": 0,
                "stream_options": usage}  # fmt: skip
        try:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"}
            connection.request("POST", "/v1/completions", json.dumps(body), headers)
            response = connection.getresponse()
            result.status = response.status
            for raw in response:
                line = raw.decode(errors="replace").strip()
                if line == "data: [DONE]":
                    result.done = True
                elif line.startswith("data: {"):
                    self.take(json.loads(line.removeprefix("data: ")))
        except (OSError, http.client.HTTPException, ValueError) as error:
            result.failure = repr(error)
        finally:
            result.ended_at = time.monotonic()

    def take(self, event: dict) -> None:
        if "error" in event:
            self.result.errors.append(event["error"])
            return
        if event.get("usage"):
            self.result.tokens = event["usage"]["completion_tokens"]
        for choice in event.get("choices", []):
            if self.result.first_chunk_at is None:
                self.result.first_chunk_at = time.monotonic()
            self.result.chunks += 1
            if choice.get("finish_reason"):
                self.result.finish_reasons.append(choice["finish_reason"])


def post(port: int, key: str, path: str, body: dict) -> tuple[int, dict[str, str], bytes]:
    """One request: status, headers (lower-case names) and body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    sent = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    connection.request("POST", path, json.dumps(body), sent)
    response = connection.getresponse()
    headers = {name.lower(): value for name, value in response.getheaders()}
    return response.status, headers, response.read()
