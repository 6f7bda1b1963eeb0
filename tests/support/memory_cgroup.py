"""A memory cgroup of a test's own, with a limit: what a container's `mem_limit` is to its
processes. A memory hog test runs its hog and the process that judges memory (the guard, a
stress run, a tune) inside one, so the hog fills the cgroup, not the host: the tests of the
other test process neither trip it nor get tripped by it (tests/conftest.py).

Needs root (as the suite's Docker Engine does) and a writable memory controller (cgroup v1's,
or v2's with `memory` in the root's subtree_control); where `unsupported()` says why not, the
hog tests skip with that reason.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from sparkserve.memory.cgroup import cgroup_mounts, read_v1, read_v2


def _hierarchy() -> tuple[Path, str] | None:
    """The memory hierarchy's mount point and version ("v1" or "v2"), v1 first."""
    mounts = cgroup_mounts(Path("/proc"))
    for root, point, kind, options in mounts:
        if kind == "cgroup" and "memory" in options.split(",") and root == "/":
            return point, "v1"
    for root, point, kind, _ in mounts:
        if kind == "cgroup2" and root == "/":
            controllers = point / "cgroup.subtree_control"
            if controllers.exists() and "memory" in controllers.read_text().split():
                return point, "v2"
    return None


def unsupported() -> str | None:
    """Why this machine cannot give a test a memory cgroup, or None when it can."""
    if os.geteuid() != 0:
        return "not root"
    found = _hierarchy()
    if found is None:
        return "no writable memory cgroup hierarchy (v1 memory controller or v2 with memory)"
    if not os.access(found[0], os.W_OK):
        return f"{found[0]} is not writable"
    return None


class MemoryCgroup:
    """A fresh cgroup under the hierarchy's root; processes join it through `preexec`."""

    def __init__(self, limit_bytes: int | None, name: str = "sparkserve-test") -> None:
        found = _hierarchy()
        if found is None:
            raise RuntimeError("no memory cgroup hierarchy: check unsupported() first")
        self.root, self.version = found
        self.path = self.root / f"{name}-{uuid.uuid4().hex[:8]}"
        self.path.mkdir()
        self.set_limit(limit_bytes)

    def set_limit(self, limit_bytes: int | None) -> None:
        """The limit in bytes; None: no limit."""
        name = "memory.limit_in_bytes" if self.version == "v1" else "memory.max"
        unlimited = "-1" if self.version == "v1" else "max"
        (self.path / name).write_text(unlimited if limit_bytes is None else str(limit_bytes))

    def usage(self) -> int:
        name = "memory.usage_in_bytes" if self.version == "v1" else "memory.current"
        return int((self.path / name).read_text())

    def headroom(self) -> int:
        """Bytes its processes can still take: under its limit, and in the host's MemAvailable
        (what sparkserve.memory.host.read_meminfo says inside it)."""
        inside = read_v1(self.path) if self.version == "v1" else read_v2(self.path, self.root)
        return min(psutil.virtual_memory().available, inside.headroom)

    def pids(self) -> list[int]:
        return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]

    def join(self) -> None:
        """Move the calling process (and what it starts afterwards) into the cgroup."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    @property
    def preexec(self) -> Callable[[], None]:
        """For subprocess.Popen(preexec_fn=...): the child joins before it runs anything."""
        return self.join

    def close(self) -> None:
        """Move what still runs inside back to the root cgroup (no limit), then remove it."""
        deadline = time.monotonic() + 10
        while True:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    (self.root / "cgroup.procs").write_text(str(pid))
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int | None) -> Iterator[MemoryCgroup]:
    """A MemoryCgroup for the `with` block; the test skips where the machine has none to give."""
    why = unsupported()
    if why is not None:
        pytest.skip(f"a memory hog test runs in a memory cgroup of its own: {why}")
    cgroup = MemoryCgroup(limit_bytes)
    try:
        yield cgroup
    finally:
        cgroup.close()
