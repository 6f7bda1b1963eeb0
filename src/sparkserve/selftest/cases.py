"""The selftest's cases: one launcher start each, with the shipped defaults but for what the
case is about.

- `plain`: serve.sh without speculation (NUM_SPEC_TOKENS=0): the int8 head, prefix caching;
  the greedy reference for speculation;
- `dflash`: serve.sh as shipped (DFlash);
- `mtp`: mtp_serve.sh as shipped (the target's MTP layer);
- `bf16`: `plain` with the bf16 head (SPARK_KEEP_BF16_LMHEAD=1): the reference for the int8
  head.

A case's server is started as a container starts it (the launcher as the process to signal)
and stopped as `docker stop` stops it: SIGTERM to the launcher with a stream open, which the
drain must finish.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkserve.client.checks import Result, not_tested
from sparkserve.client.server import Server, StreamResult
from sparkserve.knobs.registry import BY_NAME, STOP_MARGIN_S, Launcher, image_of
from sparkserve.recipes import LAUNCHER_SCRIPTS, launcher_dir
from sparkserve.selftest.models import Models

SERVED_NAME = "selftest"


@dataclass(frozen=True)
class Case:
    name: str
    launcher: Launcher  # "dflash" (serve.sh) or "mtp" (mtp_serve.sh)
    speculative: bool
    int8_head: bool
    why: str

    @property
    def script(self) -> str:
        return LAUNCHER_SCRIPTS[self.launcher]


CASES: dict[str, Case] = {
    case.name: case
    for case in (
        Case("plain", "dflash", False, True, "no speculation: the greedy reference"),
        Case("dflash", "dflash", True, True, "serve.sh as shipped"),
        Case("mtp", "mtp", True, True, "mtp_serve.sh as shipped"),
        Case("bf16", "dflash", False, False, "the bf16 head: the int8 head's reference"),
    )
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def case_env(
    case: Case, models: Models, base: Mapping[str, str], port: int, key: str, report_dir: Path
) -> dict[str, str]:
    """The environment the launcher sees: the user's (compose's, its RECIPE's knobs included)
    with the case's own knobs over it. Only what the case is about, and what a model with no
    weights needs, changes."""
    env = dict(base)
    spec = BY_NAME["NUM_SPEC_TOKENS"].default_for(case.launcher)  # 12 / 2, the image's 0 aside
    env.update(
        MODEL=str(models.target), SERVED_MODEL_NAME=SERVED_NAME, LOAD_FORMAT="dummy",
        HOST="127.0.0.1", PORT=str(port), API_KEY=key, HF_HUB_OFFLINE="1",
        NUM_SPEC_TOKENS=spec if case.speculative else "0",
        SPARK_KEEP_BF16_LMHEAD="0" if case.int8_head else "1",
        SPARKSERVE_LMHEAD_REPORT=str(report_dir),
    )  # fmt: skip
    if models.drafter is not None and case.launcher == "dflash":
        env["DRAFT_MODEL"] = str(models.drafter)
    if "MAX_MODEL_LEN" not in base:  # the knob's default may exceed a small geometry's
        default = int(BY_NAME["MAX_MODEL_LEN"].default_for(case.launcher, image_of(base)))
        env["MAX_MODEL_LEN"] = str(min(default, models.max_len or default))
    return env


@dataclass
class Running:
    case: Case
    process: subprocess.Popen[bytes]
    server: Server
    log: Path
    started: float


def start(case: Case, env: Mapping[str, str], log: Path) -> Running:
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(launcher_dir() / case.script)], env=dict(env), stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    server = Server(f"http://127.0.0.1:{env['PORT']}", env["API_KEY"], timeout_s=600)
    return Running(case, process, server, log, time.monotonic())


def wait_healthy(
    running: Running, timeout_s: float, progress: Callable[[str], None], every_s: float = 15
) -> Result:
    said = running.started
    while time.monotonic() - running.started < timeout_s:
        if running.process.poll() is not None:
            tail = running.log.read_text(errors="replace").strip().splitlines()[-3:]
            return Result("healthy", False, f"the launcher exited {running.process.returncode}"
                          f" before healthy: {' / '.join(tail)[-400:]}")  # fmt: skip
        try:
            if running.server.request("/health", timeout_s=5) is not None:
                seconds = time.monotonic() - running.started
                return Result("healthy", True, f"in {seconds:.0f} s", {"seconds": seconds})
        except Exception:  # not up yet: any error here means "not yet"
            pass
        if time.monotonic() - said >= every_s:
            said = time.monotonic()
            progress(f"starting, {said - running.started:.0f} s (log: {running.log})")
        time.sleep(2)
    return Result("healthy", False, f"not healthy within {timeout_s:.0f} s (log: {running.log})")


def stop_with_a_stream_open(running: Running, drain_s: int, max_len: int) -> Result:
    """`docker stop`: SIGTERM to the launcher while a stream is open. With a drain
    (SHUTDOWN_TIMEOUT_S > 0) the stream, a fifth of the drain long at the speed just measured,
    must end normally and the launcher exit 0 within the drain and compose's margin."""
    probe = running.server.stream_completion(SERVED_NAME, "Drain", 32)
    took = (probe.ended or 0) - probe.started
    rate = probe.completion_tokens / took if probe.completion_tokens and took > 0 else 20.0
    tokens = max(16, min(max_len - 64, int(rate * drain_s / 5)))
    holder: dict[str, StreamResult] = {}
    opened = threading.Event()

    def stream() -> None:
        holder["result"] = running.server.stream_completion(
            SERVED_NAME, "Drain", tokens, on_chunk=lambda _: opened.set()
        )

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    opened.wait(60)
    signalled = time.monotonic()
    running.process.send_signal(signal.SIGTERM)
    grace = drain_s + STOP_MARGIN_S
    try:
        code = running.process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(running.process.pid, signal.SIGKILL)
        running.process.wait()
        return Result("drain on stop", False, f"still running {grace} s after SIGTERM")
    seconds = time.monotonic() - signalled
    thread.join(30)
    result = holder.get("result")
    if result is None:
        return Result("drain on stop", False, f"exit {code} in {seconds:.1f} s; no stream result")
    finished = result.error is None and result.completion_tokens == tokens
    detail = f"exit {code} in {seconds:.1f} s; the stream of {tokens} tokens: "
    detail += "finished" if finished else f"error: {result.error}"
    if drain_s == 0:
        return Result("drain on stop", code == 0, detail + " (SHUTDOWN_TIMEOUT_S=0: no drain)")
    if result.ended is not None and result.ended < signalled:
        return not_tested("drain on stop", "the stream ended before the SIGTERM", detail)
    return Result("drain on stop", code == 0 and finished, detail)


def kill(running: Running) -> None:
    if running.process.poll() is None:
        os.killpg(running.process.pid, signal.SIGKILL)
        running.process.wait()
