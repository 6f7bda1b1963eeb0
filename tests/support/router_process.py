"""`python -m sparkserve router` as a test runs it: the cpu-serve venv's Python (its pinned
vllm-router) with this checkout's sparkserve, on loopback ports of its own, stopped with
SIGTERM as Docker stops the router service."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from support.cpu_launch import cpu_python
from support.vllm_server import LOOPBACK, free_port, tail

START_GUARD_S = 120.0  # the router and its gate up: a guard against a hang, not a promise


class RouterProcess:
    def __init__(self, work: Path, site: Path, workers: list[str], **knobs: str) -> None:
        self.port, self.router_port, self.metrics_port = free_port(), free_port(), free_port()
        self.log = work / f"router-{self.port}.log"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(site),
            "HOST": LOOPBACK,
            "ROUTER_WORKERS": ",".join(workers),
            "ROUTER_PORT": str(self.port),
            "ROUTER_METRICS_PORT": str(self.metrics_port),
            **knobs,
        }

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def metrics_target(self) -> str:
        return f"{LOOPBACK}:{self.metrics_port}"

    def admin(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`sparkserve router ARGS` against this router (drain, add, workers)."""
        argv = [cpu_python(), "-m", "sparkserve", "router", "--router-port", str(self.router_port)]
        return subprocess.run(
            [*argv, *args], env=self.env, capture_output=True, text=True, timeout=120
        )

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as reply:
                return bool(reply.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    @contextlib.contextmanager
    def running(self) -> Iterator[RouterProcess]:
        """Started, and its gate's /health 200 (a replica in rotation), until the block ends."""
        argv = [cpu_python(), "-m", "sparkserve", "router", "--router-port", str(self.router_port)]
        with self.log.open("wb") as log:
            proc = subprocess.Popen(
                argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            deadline = time.monotonic() + START_GUARD_S
            while not self._ready():
                if proc.poll() is not None:
                    raise AssertionError(f"router exited {proc.returncode}\n{tail(self.log)}")
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"router not ready in {START_GUARD_S:.0f} s\n{tail(self.log)}"
                    )
                time.sleep(0.3)
            yield self
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
