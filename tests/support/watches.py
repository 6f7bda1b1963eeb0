"""Run real pair watches (sparkserve.cluster.watch) in tests and wait for them to join."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def watch_argv(
    pid: int, rank: int, head: str, host_ip: str, port: int, state_file: Path, *,
    peer_timeout_s: float = 5.0, join_timeout_s: float = 30.0, grace_s: float = 1.0,
) -> list[str]:  # fmt: skip
    """The watch's command line for node `rank`, guarding process `pid`."""
    return [
        sys.executable, "-m", "sparkserve.cluster.watch", "--pid", str(pid), "--rank", str(rank),
        "--head-addr", head, "--host-ip", host_ip, "--port", str(port),
        "--peer-timeout-s", str(peer_timeout_s), "--join-timeout-s", str(join_timeout_s),
        "--grace-s", str(grace_s), "--state-file", str(state_file),
    ]  # fmt: skip


def read_state(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def wait_joined(
    state_file: Path, watches: list[subprocess.Popen[str]], timeout_s: float = 30.0
) -> None:
    """Until the watch writing `state_file` says the pair joined; fails at once if any of
    `watches` exits first."""
    deadline = time.monotonic() + timeout_s
    while '"state":"joined"' not in read_state(state_file):
        for watch in watches:
            if watch.poll() is not None:
                log = watch.stderr.read() if watch.stderr else ""
                raise AssertionError(f"a watch exited {watch.returncode} before joining: {log}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not joined after {timeout_s} s: {read_state(state_file)}")
        time.sleep(0.1)
