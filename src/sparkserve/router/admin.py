"""vllm-router's admin routes on loopback (GET /list_workers, /workers; POST /remove_worker,
/add_worker): what `sparkserve router drain|add|workers` and the fleet watch call. The gate
never lets them through from outside."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

ADD_TIMEOUT_S = 660  # /add_worker waits up to 600 s for the replica's /health
REMOVE_TIMEOUT_S = 30


def workers(admin: str) -> list[dict[str, Any]]:
    """vllm-router's GET /workers: each registered replica with is_healthy and load."""
    with urllib.request.urlopen(admin + "/workers", timeout=10) as answer:
        return list(json.load(answer)["workers"])


def in_rotation(admin: str) -> list[str]:
    with urllib.request.urlopen(admin + "/list_workers", timeout=10) as answer:
        return list(json.load(answer)["urls"])


def post(admin: str, route: str, url: str, timeout: float) -> tuple[int, str]:
    """POST route?url=URL: (status, body). OSError when the router does not answer."""
    query = urllib.parse.urlencode({"url": url})
    request = urllib.request.Request(f"{admin}{route}?{query}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def remove(admin: str, url: str) -> tuple[int, str]:
    return post(admin, "/remove_worker", url, REMOVE_TIMEOUT_S)


def add(admin: str, url: str) -> tuple[int, str]:
    return post(admin, "/add_worker", url, ADD_TIMEOUT_S)
