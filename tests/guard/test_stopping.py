"""The emergency stop of a vLLM tree (the memory guard's, the pair watch's): what is below the
top killed at once (no drain), the top SIGTERMed and SIGKILLed if it hangs, /dev/shm cleaned,
sparkserve's own watchers left to exit by themselves."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sparkserve.guard.stopping import Tree, stop

# A guard against a hang, never a speed target: the grace a polite top gets (it exits at its
# SIGTERM, long before; a short grace would turn a busy machine's late exit into a SIGKILL),
# and every wait for an exit.
HANG_S = 60.0

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
        # each signalled process by name and pid: the log says which part of vLLM hung
        assert re.fullmatch(
            rf"SIGKILL to 1 process\(es\) \(python\S* {child}\) below the top at once \(no "
            rf"drain\); SIGKILL to 1 process\(es\) \(python\S* {top.pid}\) after a 0\.5 s "
            r"grace; removed 1 file\(s\) they had in /dev/shm",
            how,
        ), how
        assert not segment.exists()
        assert top.wait(timeout=HANG_S) == -9
        assert not tree.alive()
    finally:
        top.kill()
        segment.unlink(missing_ok=True)
        subprocess.run(["kill", "-9", child], capture_output=True)


def test_a_polite_tree_ends_with_sigterm_alone() -> None:
    top = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        assert stop(Tree(top.pid), grace_s=HANG_S) == "the top exited after SIGTERM"
        assert top.wait(timeout=HANG_S) == -15
    finally:
        top.kill()


@pytest.mark.parametrize("pid", [2**22 + 7])
def test_a_gone_process_is_already_gone(pid: int) -> None:
    assert stop(Tree(pid), grace_s=1) == "already gone"


# vLLM with --shutdown-timeout, as it takes a SIGTERM: the top (its API server) waits for its
# child (the engine), which goes on "generating" for the drain's length and ignores SIGTERM.
DRAINING = """
import signal, subprocess, sys, time
engine = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
def drain(*_):
    engine.wait()  # the requests in flight first, for up to 60 s
    sys.exit(0)
signal.signal(signal.SIGTERM, drain)
print(engine.pid, flush=True)
time.sleep(300)
"""


def test_a_draining_tree_is_stopped_without_waiting_for_its_drain() -> None:
    top = subprocess.Popen([sys.executable, "-c", DRAINING], stdout=subprocess.PIPE, text=True)
    assert top.stdout is not None
    engine = int(top.stdout.readline())
    try:
        tree = Tree(top.pid)
        how = stop(tree, grace_s=HANG_S)
        # the engine went first: the top then had nothing to wait for, long before the grace
        assert re.fullmatch(
            rf"SIGKILL to 1 process\(es\) \(python\S* {engine}\) below the top at once \(no "
            r"drain\); the top exited after SIGTERM",
            how,
        ), how
        assert top.wait(timeout=HANG_S) == 0
        assert not tree.alive()
    finally:
        top.kill()
        subprocess.run(["kill", "-9", str(engine)], capture_output=True)


def test_the_guard_beside_vllm_is_spared_and_exits_by_itself(tmp_path: Path) -> None:
    """A stop by the pair watch leaves the memory guard (a child of vLLM, as the launcher starts
    it) alone: it sees vLLM gone and says so in its metrics file, instead of a SIGKILLed guard's
    `watching 1` for ever."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    guard = (
        f"{sys.executable} -m sparkserve.guard.monitor --pid $$ --floor-gb 0.5 --os-reserve-gb 4 "
        f"--swap-mb-s 0 --psi-full-pct 0 --textfile-dir {tmp_path} & "
        f"exec {sys.executable} -c 'import time; time.sleep(300)'"
    )
    # the shell becomes the top (a python, as vLLM is), the guard its child; sys.executable,
    # since a `python3` on PATH may be a shim that forks helpers of its own under the top
    top = subprocess.Popen(["sh", "-c", guard], env=env)
    prom = tmp_path / "guard.prom"
    try:
        deadline = time.monotonic() + HANG_S
        while "sparkserve_guard_watching 1" not in _read(prom):
            assert time.monotonic() < deadline, "the guard never started watching"
            time.sleep(0.1)
        tree = Tree(top.pid)
        assert len(tree.watchers) == 1 and not tree.below()
        assert stop(tree, grace_s=HANG_S) == "the top exited after SIGTERM"
        deadline = time.monotonic() + HANG_S
        while "sparkserve_guard_watching 0" not in _read(prom):
            assert time.monotonic() < deadline, f"the guard still watches: {_read(prom)}"
            time.sleep(0.1)
    finally:
        top.kill()
        top.wait()


def _is_keeper(pid: int) -> bool:
    try:
        return "sparkserve.guard.keeper" in psutil.Process(pid).cmdline()
    except psutil.Error:
        return False


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


# vLLM's API server under the launcher's shell (the launcher waits on it): on SIGTERM it writes
# a file and exits; its engine below it ignores SIGTERM (as one that drains would).
API_SERVER = """
import signal, subprocess, sys, time
from pathlib import Path
done = Path(sys.argv[2])  # argv: vllm serve DONE
engine = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
def stopped(*_):
    done.write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
print(engine.pid, flush=True)
time.sleep(300)
"""


def test_under_the_launchers_shell_the_api_server_is_sigtermed_and_the_engine_killed(
    tmp_path: Path,
) -> None:
    """The pid a watcher is given is the launcher's shell: the API server one level below it
    is SIGTERMed (to fail its streams and exit), never SIGKILLed at once like its engine; the
    guard's keeper beside it is spared, also when it was first seen before its exec."""
    done, go = tmp_path / "api-server-stopped", tmp_path / "exec-the-keeper"
    # a stand-in keeper: sparkserve's watchers are known by `-m MODULE` in their command line;
    # it is a shell (the launcher's fork) until the test lets it exec
    os.mkfifo(go)
    keeper = (f"read -r _ < {go}; exec {sys.executable} -c 'import time; time.sleep(300)' "
              "-m sparkserve.guard.keeper")  # fmt: skip
    # a script named vllm run as `vllm serve`, as the launcher's `vllm serve ...` is
    script = tmp_path / "vllm"
    script.write_text(API_SERVER)
    launcher = f"({keeper}) & {sys.executable} {script} serve {done} & wait $!"
    top = subprocess.Popen(["bash", "-c", launcher], stdout=subprocess.PIPE, text=True,
                           start_new_session=True)  # fmt: skip
    try:
        assert top.stdout is not None
        engine = int(top.stdout.readline())
        tree = Tree(top.pid)
        forked = [p.pid for p in tree.below() if p.pid != engine]
        assert len(forked) == 1 and not tree.watchers, tree.below()  # not a watcher yet
        go.write_text("exec\n")  # the fork reads it and becomes the keeper
        deadline = time.monotonic() + HANG_S
        while not _is_keeper(forked[0]):
            assert time.monotonic() < deadline, "the keeper's stand-in never ran"
            time.sleep(0.02)
        assert [p.pid for p in tree.below()] == [engine], tree.below()
        assert len(tree.tops()) == 2 and len(tree.watchers) == 1, (tree.tops(), tree.watchers)
        said = stop(tree, grace_s=HANG_S)
        assert said.startswith("SIGKILL to 1 process(es) (python"), said
        assert f" {engine}) below the top at once" in said, said
        assert said.endswith("the top exited after SIGTERM"), said
        assert done.read_text() == "SIGTERM"
        top.wait(timeout=HANG_S)  # the shell went with it
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(top.pid, signal.SIGKILL)  # the keeper stand-in, too
        top.wait()
