"""Start, probe and stop a vLLM OpenAI server process for end-to-end tests.

The server is started from an argv and an environment (so a test can launch it through
the project's own launcher), its output goes to a log file (never a pipe, which could
fill up and block the server), and it is only ever reached on a loopback address.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sparkserve.client.metrics import MetricKey, Snapshot
from sparkserve.client.metrics import parse as parse_metrics

LOOPBACK = "127.0.0.1"
# How long a start may take before a test calls the server hung: a guard, not a promise. On
# CI's two cores, shared by two test processes and containers, the tiny DFlash server once
# took more than 300 s to answer /health (2026-12-05).
START_GUARD_S = 900.0


class ServerError(RuntimeError):
    """The server died or did not get healthy; the message carries the log tail."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on the loopback address right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _check_loopback(host: str) -> None:
    if not (host.startswith("127.") or host in ("localhost", "::1")):
        raise ValueError(f"test servers are reached on loopback only, not {host!r}")


def tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def metric_sum(metrics: Mapping[MetricKey, float], name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels`` (a snapshot of
    sparkserve.client.metrics.parse, which ``parse_metrics`` names here for the tests)."""
    total = 0.0
    for (n, pairs), value in metrics.items():
        if n == name and all((k, v) in pairs for k, v in labels.items()):
            total += value
    return total


def stop_group_of(pid_file: Path, timeout_s: float = 40) -> None:
    """SIGTERM to the process group whose leader's pid `pid_file` holds (a launcher a test or a
    tool restarted), SIGKILL after `timeout_s`; returns once the leader is gone."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state == "Z":
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@dataclass
class VllmServer:
    argv: Sequence[str]
    log_path: Path
    port: int
    env: Mapping[str, str] | None = None
    host: str = LOOPBACK
    cwd: str | Path | None = None
    # run in the child before the server (tests/support/memory_cgroup.py: join a cgroup)
    preexec: Callable[[], None] | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    started_at: float = field(default=0.0, init=False)
    ready_after_s: float | None = field(default=None, init=False)
    stop_took_s: float | None = field(default=None, init=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        _check_loopback(self.host)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> VllmServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        env = dict(os.environ if self.env is None else self.env)
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            list(self.argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.cwd,
            start_new_session=True,  # its own process group: stop() can reach workers
            preexec_fn=self.preexec,
        )
        return self

    def _fail(self, why: str) -> ServerError:
        return ServerError(f"{why}\n--- {self.log_path} (tail) ---\n{tail(self.log_path)}")

    def healthy(self) -> bool:
        """/health answers 200 now."""
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def wait_healthy(self, timeout_s: float = START_GUARD_S) -> float:
        """Poll /health until 200; returns seconds since start. Fails fast on exit."""
        assert self.proc is not None, "start() first"
        deadline = self.started_at + timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise self._fail(f"server exited with {code} before getting healthy")
            if self.healthy():
                self.ready_after_s = time.monotonic() - self.started_at
                return self.ready_after_s
            time.sleep(0.5)
        raise self._fail(f"server not healthy after {timeout_s:.0f} s")

    def request(self, path: str, body: Any | None = None, timeout_s: float = 120.0) -> Any:
        """GET (body None) or POST JSON to the server; returns decoded JSON or text."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path,
            data=data,
            headers={"Content-Type": "application/json"} if data else {},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                raw = r.read().decode()
                ctype = r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            raise self._fail(f"{path}: HTTP {e.code}: {detail}") from e
        return json.loads(raw) if "json" in ctype else raw

    def metrics(self) -> Snapshot:
        return parse_metrics(self.request("/metrics"))

    def stop(self, timeout_s: float = 30.0) -> float:
        """SIGTERM the server, wait for it, SIGKILL its group after ``timeout_s``.

        Returns (and keeps in ``stop_took_s``) how long the exit took."""
        if self.proc is None:
            return 0.0
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.stop_took_s = time.monotonic() - t0
        # Leftover children of this server only (same session): end them too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.stop_took_s

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
