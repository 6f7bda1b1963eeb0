"""`sparkserve cluster health`: is this node's pair up? (compose's healthcheck on each node)

Healthy (exit 0) only when this node's watch runs, the pair has joined, the peer's last beat
is younger than the peer timeout and, on the head, vLLM's /health answers 200. Otherwise one
line saying what is missing, exit 1.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import psutil

from sparkserve.command_line import EXIT_FAILED, EXIT_OK

API_TIMEOUT_S = 5.0


def problem(state_file: Path, now: float | None = None) -> str | None:
    """What keeps the pair from being healthy, or None."""
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return f"no pair watch state in {state_file} (CLUSTER_NODES=2 and the launcher started?)"
    if not isinstance(state, Mapping) or not psutil.pid_exists(int(state.get("watch_pid", 0))):
        return f"the pair watch is not running ({state_file}: {state.get('reason') or 'gone'})"
    if state.get("state") != "joined":
        why = state.get("reason") or "waiting for the other node"
        return f"the pair is not joined: {state.get('state')}: {why}"
    silent = (time.time() if now is None else now) - float(state.get("peer_seen_at", 0))
    if silent > float(state.get("peer_timeout_s", 0)):
        return f"no heartbeat from the peer ({state.get('peer')}) for {silent:.0f} s"
    api = str(state.get("api") or "")
    if api:
        try:
            with urllib.request.urlopen(api + "/health", timeout=API_TIMEOUT_S) as answer:
                if answer.status != 200:
                    return f"vLLM's {api}/health answered {answer.status}"
        except (urllib.error.URLError, OSError) as error:
            return f"vLLM's {api}/health does not answer ({error})"
    return None


def run(state_file: Path, prog: str) -> int:
    found = problem(state_file)
    if found is not None:
        print(f"{prog}: {found}")
        return EXIT_FAILED
    return EXIT_OK
