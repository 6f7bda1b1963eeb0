"""Stop vLLM and everything it started, even when part of it hangs.

vLLM's processes form a tree (API server, engine core, workers). A rank may sit in a
collective that never returns (its peer is gone) and ignore SIGTERM, and a tree killed with
SIGKILL leaves its shared-memory rings (/dev/shm/psm_*, Python's SharedMemory names) behind.
So: SIGTERM the top, wait for the whole tree up to a grace, SIGKILL what is left (the tree is
collected before any signal, plus whatever was seen below it earlier, since a child whose
parent died is no longer found below it), then remove the /dev/shm files the killed
processes had open. The memory guard and the pair watch both stop vLLM this way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

SHM = "/dev/shm/"


class Tree:
    """The processes under a pid, remembered as they are seen (refresh() now and then)."""

    def __init__(self, pid: int) -> None:
        self.top: psutil.Process | None
        try:
            self.top = psutil.Process(pid)
        except psutil.Error:
            self.top = None
        self.seen: dict[int, psutil.Process] = {}
        self.refresh()

    def refresh(self) -> None:
        if self.top is None:
            return
        # Never ourselves, nor our parent (the guard keeper that runs the guard): both end
        # by themselves once vLLM is gone, and a stop must not wait for them.
        ours = {os.getpid(), os.getppid()}
        with contextlib.suppress(psutil.Error):
            for child in self.top.children(recursive=True):
                if child.pid not in ours:
                    self.seen[child.pid] = child

    def top_alive(self) -> bool:
        return self.top is not None and _running(self.top)

    def alive(self) -> list[psutil.Process]:
        self.refresh()
        members = [self.top] if self.top is not None else []
        return [proc for proc in [*members, *self.seen.values()] if _running(proc)]


def _running(proc: psutil.Process) -> bool:
    """Running and not a zombie (is_running also tells a reused pid apart)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until none runs (a zombie counts as gone) or `timeout_s`; returns those left."""
    deadline = time.monotonic() + timeout_s
    left = [proc for proc in procs if _running(proc)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [proc for proc in left if _running(proc)]
    return left


def shm_files(procs: Iterable[psutil.Process]) -> set[Path]:
    """Files under /dev/shm the processes have mapped or open."""
    found: set[Path] = set()
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            for line in Path(f"/proc/{proc.pid}/maps").read_text().splitlines():
                _, sep, path = line.partition(SHM)
                if sep:
                    found.add(Path(SHM + path.removesuffix(" (deleted)")))
        with contextlib.suppress(psutil.Error, OSError):
            found.update(Path(f.path) for f in proc.open_files() if f.path.startswith(SHM))
    return found


def stop(tree: Tree, grace_s: float) -> str:
    """SIGTERM the top, SIGKILL the tree after `grace_s`; returns what happened, in words."""
    procs = tree.alive()
    if not procs:
        return "already gone"
    if tree.top is not None and tree.top in procs:
        with contextlib.suppress(psutil.Error):
            tree.top.send_signal(signal.SIGTERM)
    wait_gone(procs, grace_s)
    left = tree.alive()
    if not left:
        return "exited after SIGTERM"
    files = shm_files(left)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    wait_gone(left, 5.0)
    removed = 0
    for path in files:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return (
        f"SIGKILL to {len(left)} process(es) after a {grace_s:g} s grace; removed {removed} "
        "file(s) they had in /dev/shm"
    )
