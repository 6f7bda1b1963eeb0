"""`python -m sparkserve router` as a test runs it: the cpu-serve venv's Python (its pinned
vllm-router) with this checkout's sparkserve, on loopback ports of its own, stopped with
SIGTERM as Docker stops the router service. `running()` for a block; `start()`,
`wait_ready()` and `stop()` for a test that watches the process itself."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil

from support.cpu_launch import cpu_python
from support.vllm_server import LOOPBACK, free_port, tail

START_GUARD_S = 120.0  # the router and its gate up: a guard against a hang, not a promise
STOP_GUARD_S = 60.0  # SIGTERM to exit: a guard, not a promise
ADMIN_GUARD_S = 700.0  # one `sparkserve router drain|add|workers`: a guard


class RouterProcess:
    def __init__(
        self, work: Path, site: Path, workers: list[str], grace_s: float | None = None,
        **knobs: str,
    ) -> None:  # fmt: skip
        """`knobs` go into its environment (API_KEY, ROUTER_POLICY...); `grace_s` is passed as
        --grace-s (how long a stop waits for requests in flight)."""
        self.port, self.router_port, self.metrics_port = free_port(), free_port(), free_port()
        self.log = work / f"router-{self.port}.log"
        self.grace = [] if grace_s is None else ["--grace-s", f"{grace_s:g}"]
        self.env = {
            **os.environ,
            "PYTHONPATH": str(site),
            "HOST": LOOPBACK,
            "ROUTER_WORKERS": ",".join(workers),
            "ROUTER_PORT": str(self.port),
            "ROUTER_METRICS_PORT": str(self.metrics_port),
            **knobs,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def metrics_target(self) -> str:
        return f"{LOOPBACK}:{self.metrics_port}"

    def _argv(self) -> list[str]:
        return [cpu_python(), "-m", "sparkserve", "router", "--router-port", str(self.router_port)]

    def admin(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`sparkserve router ARGS` against this router (drain, add, workers; none: serve)."""
        return subprocess.run(
            [*self._argv(), *args], env=self.env, capture_output=True, text=True,
            timeout=ADMIN_GUARD_S,
        )  # fmt: skip

    def in_rotation(self) -> list[str]:
        """The replicas in rotation, as `sparkserve router workers` lists them."""
        done = self.admin("workers")
        assert done.returncode == 0, done.stderr
        return [worker["url"] for worker in json.loads(done.stdout)]

    def start(self) -> RouterProcess:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [*self._argv(), *self.grace], env=self.env, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as reply:
                return bool(reply.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def wait_ready(self) -> None:
        """Until the gate's /health is 200 (a replica in rotation); fails if it exits."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + START_GUARD_S
        while not self._ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"router exited {self.proc.returncode}\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"router not ready in {START_GUARD_S:.0f} s\n{self.tail()}")
            time.sleep(0.3)

    def children(self) -> list[psutil.Process]:
        assert self.proc is not None
        return psutil.Process(self.proc.pid).children()

    def stop(self) -> int:
        """SIGTERM (once running), its exit status; SIGKILL and TimeoutExpired after the guard."""
        assert self.proc is not None, "start() first"
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(STOP_GUARD_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        return self.proc.returncode

    def tail(self) -> str:
        return tail(self.log)

    @contextlib.contextmanager
    def running(self) -> Iterator[RouterProcess]:
        """Started, and its gate's /health 200 (a replica in rotation), until the block ends."""
        self.start()
        try:
            self.wait_ready()
            yield self
        finally:
            self.stop()
