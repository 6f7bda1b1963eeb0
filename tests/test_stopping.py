"""Stopping a node's process tree: SIGTERM first, SIGKILL for what hangs, /dev/shm cleaned."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.stopping import Tree, stop

# Maps a file in /dev/shm (as Python's SharedMemory, psm_*, does), ignores SIGTERM and has a
# child that does the same: a rank stuck in a collective.
STUCK = """
import mmap, os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
name = f"psm_sparkserve_test_{os.getpid()}"
handle = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(handle, 4096)
ring = mmap.mmap(handle, 4096)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print(name, child.pid, flush=True)
time.sleep(300)
"""


def test_a_tree_that_ignores_sigterm_is_killed_and_its_shared_memory_removed() -> None:
    top = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE, text=True)
    assert top.stdout is not None
    name, child = top.stdout.readline().split()
    segment = Path("/dev/shm") / name
    try:
        assert segment.exists()
        tree = Tree(top.pid)
        how = stop(tree, grace_s=0.5)
        assert how.startswith("SIGKILL to 2 process(es) after a 0.5 s grace; removed 1 file(s)")
        assert not segment.exists()
        assert top.wait(timeout=5) == -9
        assert not tree.alive()
    finally:
        top.kill()
        segment.unlink(missing_ok=True)
        subprocess.run(["kill", "-9", child], capture_output=True)


def test_a_polite_tree_ends_with_sigterm_alone() -> None:
    top = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        assert stop(Tree(top.pid), grace_s=5) == "exited after SIGTERM"
        assert top.wait(timeout=5) == -15
    finally:
        top.kill()


@pytest.mark.parametrize("pid", [2**22 + 7])
def test_a_gone_process_is_already_gone(pid: int) -> None:
    assert stop(Tree(pid), grace_s=1) == "already gone"
