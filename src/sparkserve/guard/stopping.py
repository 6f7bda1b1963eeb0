"""Stop vLLM and everything it started at once, even when part of it hangs.

This is the emergency stop of the memory guard and the pair watch: it never lets vLLM drain.
A SIGTERM alone would: with --shutdown-timeout (SHUTDOWN_TIMEOUT_S) vLLM's API server and its
engine both take SIGTERM and SIGINT alike as "finish the requests in flight first", and ignore a
second signal while they drain (vLLM 0.32 and 0.33: entrypoints/launchers/launcher.py and
v1/engine/core.py), so streams would go on generating, and holding memory, for up to that long.

vLLM's processes form a tree: the API server, the engine core and workers below it, and above
it the launcher's shell when the launcher started it (the shell waits on vLLM). A rank may sit
in a collective that never returns (its peer is gone), and a tree killed with SIGKILL leaves
its shared-memory rings (/dev/shm/psm_*, Python's SharedMemory names) behind. So: SIGKILL every
process below the API server at once (the model, its memory and every request in flight go with
the engine) and, in the same moment, SIGTERM the top and the API server (which then has nothing
to drain: it fails the open streams and exits; the launcher's shell exits with it), SIGKILL
what is left after a grace, then remove the /dev/shm files the killed processes had open. The
tree is collected before any signal, plus whatever was seen below it earlier, since a child
whose parent died is no longer found below it. sparkserve's own watchers (the guard, its
keeper, the pair watch) are no part of it: started beside vLLM, they exit by themselves when it
does, saying why.
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
# Modules of sparkserve's watchers that the launchers start beside vLLM (as its children).
WATCHERS = ("sparkserve.guard.monitor", "sparkserve.guard.keeper", "sparkserve.cluster.watch")
# The pid the watchers are given is the launcher's ($$), which waits on vLLM as its child: the
# top's child whose command line is `vllm serve` is vLLM's API server.
API_SERVER = ("vllm", "serve")


class Tree:
    """The processes under a pid, remembered as they are seen (refresh() now and then)."""

    def __init__(self, pid: int) -> None:
        self.top: psutil.Process | None
        try:
            self.top = psutil.Process(pid)
        except psutil.Error:
            self.top = None
        self.seen: dict[int, psutil.Process] = {}
        self.watchers: set[int] = set()  # this process, and sparkserve's other watchers
        self.heads: set[int] = set()  # the API server under the launcher: see API_SERVER
        self.refresh()

    def refresh(self) -> None:
        if self.top is None:
            return
        # Never ourselves, nor our parent (the guard keeper that runs the guard): both end
        # by themselves once vLLM is gone, and a stop must not wait for them.
        ours = {os.getpid(), os.getppid()}
        with contextlib.suppress(psutil.Error):
            for child in self.top.children(recursive=True):
                if child.pid in self.watchers:
                    continue
                # Looked at every time, not once: a watcher seen between the launcher's fork
                # and its exec is a shell at first, and must not stay counted as vLLM's.
                if child.pid in ours or _is_watcher(child):
                    self.watchers.add(child.pid)
                    self.seen.pop(child.pid, None)
                    self.heads.discard(child.pid)
                elif child.pid not in self.seen:
                    self.seen[child.pid] = child
                    if self._under_launcher_shell(child):
                        self.heads.add(child.pid)

    def _under_launcher_shell(self, child: psutil.Process) -> bool:
        assert self.top is not None
        try:
            words = [os.path.basename(w) for w in child.cmdline()[:3]]
            return child.ppid() == self.top.pid and any(
                tuple(words[i : i + 2]) == API_SERVER for i in range(len(words))
            )
        except psutil.Error:
            return False

    def top_alive(self) -> bool:
        return self.top is not None and _running(self.top)

    def alive(self) -> list[psutil.Process]:
        self.refresh()
        members = [self.top] if self.top is not None else []
        return [proc for proc in [*members, *self.seen.values()] if _running(proc)]

    def below(self) -> list[psutil.Process]:
        """The tree's running processes but the top and the API server under a launcher shell:
        what a stop SIGKILLs at once."""
        return [p for p in self.alive() if p is not self.top and p.pid not in self.heads]

    def tops(self) -> list[psutil.Process]:
        """What a stop SIGTERMs: the top, and vLLM's API server when the top is its launcher."""
        return [p for p in self.alive() if p is self.top or p.pid in self.heads]


def _is_watcher(proc: psutil.Process) -> bool:
    try:
        words = proc.cmdline()
    except psutil.Error:
        return False
    return any(words[i : i + 2] == ["-m", module] for module in WATCHERS for i in range(len(words)))


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


def named(procs: list[psutil.Process]) -> str:
    """`N process(es) (name pid, ...)`: what a stop signals, for its log line."""
    words = []
    for proc in procs:
        try:
            words.append(f"{proc.name()} {proc.pid}")
        except psutil.Error:
            words.append(f"pid {proc.pid}")
    return f"{len(procs)} process(es) ({', '.join(words)})"


def _signal(procs: list[psutil.Process], signum: signal.Signals) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signum)


def kill(procs: list[psutil.Process]) -> set[Path]:
    """SIGKILL them and wait until they are gone; returns the /dev/shm files they had."""
    files = shm_files(procs)
    _signal(procs, signal.SIGKILL)
    wait_gone(procs, 5.0)
    return files


def stop(tree: Tree, grace_s: float) -> str:
    """SIGKILL below the top at once, SIGTERM the top, SIGKILL it after `grace_s`; returns
    what happened, in words."""
    procs = tree.alive()
    if not procs:
        return "already gone"
    said: list[str] = []
    tops = tree.tops()  # before the kill: a top that only waited on what is below goes with it
    below = tree.below()
    files = shm_files(below)
    if below:
        said.append(f"SIGKILL to {named(below)} below the top at once (no drain)")
    # Both at once: a SIGKILLed process never runs again, so the top has nothing left to drain
    # when its SIGTERM lands, and the grace runs while the kernel tears the engine down (which
    # takes seconds for a large process on a busy host) instead of after it.
    _signal(below, signal.SIGKILL)
    _signal(tops, signal.SIGTERM)
    wait_gone([*tops, *below], grace_s)
    left = tree.alive()  # the top, and anything it started meanwhile
    if left:
        said.append(f"SIGKILL to {named(left)} after a {grace_s:g} s grace")
        files |= kill(left)
    elif tops:
        said.append("the top exited after SIGTERM")
    removed = 0
    for path in files:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    if removed:
        said.append(f"removed {removed} file(s) they had in /dev/shm")
    return "; ".join(said)
