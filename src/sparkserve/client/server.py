"""A vLLM OpenAI-compatible server, reached with the standard library only.

`Server` checks the endpoint before any load (`probe`), reads /metrics, and runs streaming
completions (`stream_completion`), timing the first token and the last one.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkserve.client import metrics


class ServerError(RuntimeError):
    """The server cannot be used: unreachable, an HTTP error, or an unexpected answer."""


class PreflightError(ServerError):
    """Checked before any load: bad URL, server down, unknown model."""


@dataclass(frozen=True)
class ServerInfo:
    model: str
    served: tuple[str, ...]
    max_model_len: int | None
    pool_tokens: int | None
    pool_source: str


@dataclass
class StreamResult:
    """One streaming request, timed on the client's monotonic clock."""

    started: float
    first_token: float | None = None
    last_token: float | None = None
    ended: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    chunks: int = 0
    error: str | None = None
    text_chars: int = 0
    finish_reason: str | None = None
    chunk_times: list[float] = field(default_factory=list, repr=False)
    # tokens each timed chunk carried, where the request asked for them (vLLM's
    # return_token_ids): with speculative decoding one chunk may carry several
    chunk_tokens: list[int] = field(default_factory=list, repr=False)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first over the time from first to last token."""
        if self.first_token is None or self.last_token is None or self.completion_tokens < 2:
            return None
        span = self.last_token - self.first_token
        return (self.completion_tokens - 1) / span if span > 0 else None


class Server:
    def __init__(self, url: str, api_key: str = "", timeout_s: float = 900.0) -> None:
        parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise PreflightError(f"bad --url {url!r}: must be http://HOST:PORT or https://...")
        try:
            port = parsed.port
        except ValueError as exc:
            raise PreflightError(f"bad --url {url!r}: {exc}") from None
        self.url = f"{parsed.scheme}://{parsed.netloc}"
        self.scheme = parsed.scheme
        self.host = parsed.hostname
        self.port = port or (443 if parsed.scheme == "https" else 80)
        self.prefix = parsed.path.rstrip("/")
        if self.prefix.endswith("/v1"):
            self.prefix = self.prefix[: -len("/v1")]
        self.api_key = api_key
        self.timeout_s = timeout_s

    # -- plumbing -------------------------------------------------------------------------
    def _conn(self, timeout_s: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout_s)

    def _headers(self, body: bool) -> dict[str, str]:
        headers = {"Accept": "*/*"}
        if body:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def request(self, path: str, body: Any | None = None, timeout_s: float = 30.0) -> Any:
        """GET (no body) or POST JSON; returns JSON or text; raises ServerError."""
        conn = self._conn(timeout_s)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(
                "GET" if data is None else "POST",
                self.prefix + path,
                body=data,
                headers=self._headers(data is not None),
            )
            response = conn.getresponse()
            raw = response.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            raise ServerError(f"{self.url}{path}: {_why(exc)}") from None
        finally:
            conn.close()
        if response.status != 200:
            raise ServerError(f"{self.url}{path}: HTTP {response.status}: {raw[:300].strip()}")
        if "json" in response.getheader("Content-Type", ""):
            return json.loads(raw)
        return raw

    def vllm_version(self) -> str:
        """The release the server runs, as its /version says; "unknown" when it does not say."""
        try:
            return str(self.request("/version")["version"])
        except (ServerError, KeyError, TypeError):
            return "unknown"

    def metrics(self) -> metrics.Snapshot:
        return metrics.parse(str(self.request("/metrics")))

    def settled_metrics(self, wait_s: float = 3.0) -> metrics.Snapshot:
        """/metrics once its counters stop moving (the last engine step's stats can reach the
        API process just after the last response), or after `wait_s`."""
        deadline = time.monotonic() + wait_s
        last = self.metrics()
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = self.metrics()
            if _counters(now) == _counters(last):
                return now
            last = now
        return last

    # -- before any load ------------------------------------------------------------------
    def probe(self, model: str | None, pool_tokens: int | None = None) -> ServerInfo:
        """Check the server answers and serves `model` (None: the only model it serves)."""
        try:
            listing = self.request("/v1/models", timeout_s=10)
        except ServerError as exc:
            raise PreflightError(f"server not usable: {exc}") from None
        try:
            entries = [e for e in listing["data"] if isinstance(e, dict)]
            names = tuple(str(e["id"]) for e in entries)
        except (TypeError, KeyError):
            raise PreflightError(f"{self.url}/v1/models: not an OpenAI model list") from None
        if model is None:
            if len(names) != 1:
                raise PreflightError(
                    f"the server serves {len(names)} models ({', '.join(names) or 'none'}): "
                    "name one with --model"
                )
            model = names[0]
        if model not in names:
            raise PreflightError(
                f"model {model!r} is not served by {self.url}; it serves: {', '.join(names)}"
            )
        entry = entries[names.index(model)]
        max_len = entry.get("max_model_len")
        source = "--pool-tokens"
        if pool_tokens is None:
            try:
                pool_tokens = metrics.cache_pool_tokens(self.metrics())
                source = "/metrics vllm:cache_config_info"
            except ServerError:
                pool_tokens = None
        if pool_tokens is None:
            source = "unknown"
        return ServerInfo(
            model=model,
            served=names,
            max_model_len=int(max_len) if isinstance(max_len, int | float) else None,
            pool_tokens=pool_tokens,
            pool_source=source,
        )

    def tokenize(self, model: str, text: str) -> list[int]:
        return self.token_ids({"model": model, "prompt": text})

    def token_ids(self, body: dict[str, Any]) -> list[int]:
        """/tokenize of a request body: a prompt, or chat messages through the template."""
        reply = self.request("/tokenize", body)
        try:
            return [int(t) for t in reply["tokens"]]
        except (TypeError, KeyError, ValueError):
            raise ServerError(f"{self.url}/tokenize: unexpected answer") from None

    # -- load -----------------------------------------------------------------------------
    def stream_completion(
        self, model: str, prompt: str | Sequence[int], max_tokens: int, **options: Any
    ) -> StreamResult:
        """A streaming /v1/completions request (text or token ids); never raises. `options`:
        those of `stream`."""
        body = {"prompt": list(prompt) if not isinstance(prompt, str) else prompt}
        return self.stream("/v1/completions", model, body, max_tokens, **options)

    def stream_chat(self, model: str, text: str, max_tokens: int, **options: Any) -> StreamResult:
        """A streaming /v1/chat/completions request with one user message; never raises."""
        body = {"messages": [{"role": "user", "content": text}]}
        return self.stream("/v1/chat/completions", model, body, max_tokens, **options)

    def stream(
        self,
        path: str,
        model: str,
        body: dict[str, Any],
        max_tokens: int,
        *,
        ignore_eos: bool = True,
        on_chunk: Callable[[StreamResult], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> StreamResult:
        """POST a streaming request (greedy) and time its chunks; errors land in `.error`."""
        body = {
            **body,
            "model": model,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if ignore_eos:
            body["ignore_eos"] = True  # a vLLM extension: generate the full max_tokens
        result = StreamResult(started=time.monotonic())
        conn = self._conn(self.timeout_s)
        try:
            conn.request(
                "POST", self.prefix + path, body=json.dumps(body).encode(),
                headers=self._headers(True),
            )  # fmt: skip
            response = conn.getresponse()
            if response.status != 200:
                detail = response.read().decode(errors="replace")[:300].strip()
                result.error = f"HTTP {response.status}: {detail}"
                return result
            done = False
            for raw in response:
                if should_stop is not None and should_stop():
                    result.error = "stopped"
                    break
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    result.error = f"server error: {chunk['error']}"
                    break
                _take_chunk(result, chunk, time.monotonic())
                if on_chunk is not None:
                    on_chunk(result)
            if not done and result.error is None:
                result.error = "the stream ended before [DONE] (server stopped?)"
            elif result.finish_reason == "abort" and result.error is None:
                result.error = "the server aborted the request (stopping?)"
        except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
            result.error = _why(exc)
        finally:
            conn.close()
            result.ended = time.monotonic()
        return result


def _take_chunk(result: StreamResult, chunk: dict[str, Any], now: float) -> None:
    usage = chunk.get("usage")
    if usage:
        result.prompt_tokens = usage.get("prompt_tokens")
        result.completion_tokens = int(usage.get("completion_tokens") or 0)
    for choice in chunk.get("choices") or []:
        if choice.get("finish_reason") is not None:
            result.finish_reason = str(choice["finish_reason"])
        delta = choice.get("delta") or {}
        text = choice.get("text") or ""
        for key in ("content", "reasoning_content", "reasoning"):
            text += delta.get(key) or ""
        if delta.get("tool_calls"):
            text += json.dumps(delta["tool_calls"])
        carried = choice.get("token_ids")  # tokens whose text may be empty (special ones)
        if (
            not text
            and not carried
            and (choice.get("finish_reason") is not None or "role" in delta)
        ):
            continue  # the closing chunk, or the chat API's opening role-only chunk
        if result.first_token is None:
            result.first_token = now
        result.last_token = now
        result.text_chars += len(text)
        result.chunks += 1
        result.chunk_times.append(now)
        if carried is not None:
            result.chunk_tokens.append(len(carried))


def _counters(snapshot: metrics.Snapshot) -> dict[metrics.MetricKey, float]:
    return {k: v for k, v in snapshot.items() if k[0].endswith("_total")}


def _why(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is the server running?)"
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, http.client.RemoteDisconnected | ConnectionResetError):
        return "the server closed the connection (stopped?)"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]
