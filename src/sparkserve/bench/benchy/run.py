"""llama-benchy as a child process, its output passed through line by line, and /metrics
read at the start of each of its tests and at the end: the windows the report joins to its
rows. A thread reads the KV cache usage once a second for each window's peak."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sparkserve.client import metrics
from sparkserve.client.server import Server, ServerError

# what llama-benchy 0.4.0 prints as each test starts (runner.py run_suite)
TEST_LINE = re.compile(r"^Running test: pp=(\d+), tg=(\d+), depth=(\d+), concurrency=(\d+)\s*$")
KV_EVERY_S = 1.0
STOP_WAIT_S = 15.0  # after Ctrl-C: llama-benchy's time to end its requests, then SIGKILL


@dataclass
class Window:
    """One llama-benchy test: its settings and what /metrics said as it began and ended."""

    pp: int
    tg: int
    depth: int
    concurrency: int
    before: metrics.Snapshot
    after: metrics.Snapshot | None = None
    kv_samples: list[float] = field(default_factory=list)
    cut_short: bool = False  # llama-benchy failed or was stopped during this test

    def summary(self, model: str) -> dict[str, object]:
        after = self.after or self.before
        return {
            "pp": self.pp, "tg": self.tg, "depth": self.depth, "concurrency": self.concurrency,
            "cut_short": self.cut_short or self.after is None,
            "speculation": metrics.acceptance(self.before, after, model),
            "prefix_cache": metrics.prefix_hit_rate(self.before, after, model),
            "kv_cache_usage_peak": max(self.kv_samples) if self.kv_samples else None,
        }  # fmt: skip


@dataclass
class Run:
    returncode: int | None = None
    windows: list[Window] = field(default_factory=list)
    metrics_error: str | None = None  # /metrics stopped answering: the join ends there


class _KvSampler(threading.Thread):
    def __init__(self, server: Server, run: Run) -> None:
        super().__init__(daemon=True)
        self.server, self.run_ = server, run
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(KV_EVERY_S):
            if not self.run_.windows:
                continue
            try:
                usage = metrics.total(self.server.metrics(), metrics.KV_USAGE)
            except ServerError:
                continue
            self.run_.windows[-1].kv_samples.append(usage)


def run_llama_benchy(
    argv: Sequence[str],
    env: Mapping[str, str],
    server: Server,
    echo: Callable[[str], None],
    run: Run,
) -> None:
    """Run llama-benchy (`argv` after the interpreter; the key, if any, in `env` under
    sparkserve.bench.benchy.keyed.KEY_ENV, never in `argv`), echo its lines, and cut its run into
    windows in `run`. Ctrl-C is passed on to it, and KeyboardInterrupt raised again once it
    ended; what was measured stays in `run`."""
    child = subprocess.Popen(
        [sys.executable, "-u", "-m", "sparkserve.bench.benchy.keyed", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(env),
        start_new_session=True,  # Ctrl-C reaches it from here, once, not from the terminal
    )  # fmt: skip
    sampler = _KvSampler(server, run)
    sampler.start()
    try:
        assert child.stdout is not None
        for line in child.stdout:
            match = TEST_LINE.match(line.strip())
            if match:  # the test's window opens before its line is shown
                _boundary(server, run, tuple(int(g) for g in match.groups()))
            echo(line.rstrip("\n"))
        run.returncode = child.wait()
        _boundary(server, run, None, cut=run.returncode != 0)
    except KeyboardInterrupt:
        _stop(child)
        run.returncode = child.returncode
        _boundary(server, run, None, cut=True)
        raise
    finally:
        sampler.stopped.set()
        if child.poll() is None:
            _stop(child)


def _boundary(server: Server, run: Run, test: tuple[int, ...] | None, cut: bool = False) -> None:
    """Close the open window with a snapshot (`cut`: its test did not finish) and open the
    next test's (None: the end)."""
    if cut and run.windows:
        run.windows[-1].cut_short = True
    if run.metrics_error is not None:
        return
    try:
        snapshot = server.settled_metrics() if test is None else server.metrics()
    except ServerError as exc:
        run.metrics_error = str(exc)
        return
    if run.windows and run.windows[-1].after is None:
        run.windows[-1].after = snapshot
    if test is not None:
        pp, tg, depth, concurrency = test
        run.windows.append(Window(pp, tg, depth, concurrency, before=snapshot))


def _stop(child: subprocess.Popen[str]) -> None:
    try:
        os.killpg(child.pid, signal.SIGINT)
        child.wait(STOP_WAIT_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
