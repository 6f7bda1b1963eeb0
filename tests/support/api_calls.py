"""HTTP calls the router tests make to a replica or a router: a request with or without the
API key that returns the status and the body (an error status too), and a chat request's
body."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def call(url: str, key: str | None, method: str = "GET", body: Any | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, str]:  # fmt: skip
    """(status, body text) of one request; `key` (None: no Authorization) as Bearer."""
    data = None if body is None else json.dumps(body).encode()
    sent = {"Content-Type": "application/json"} if data is not None else {}
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    sent.update(headers or {})
    request = urllib.request.Request(url, data=data, headers=sent, method=method)
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def chat(content: str = "Say something about routers.", max_tokens: int = 8,
         **fields: Any) -> dict[str, Any]:  # fmt: skip
    """A chat completion request's body, one user message; `fields` besides (model, user...)."""
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **fields}
