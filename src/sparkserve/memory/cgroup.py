"""The memory cgroup this process runs in: its limit and what is left under it.

A container started with a memory limit (Compose's `mem_limit`, `docker run -m`) sees the host's
/proc/meminfo, so MemAvailable there says nothing about how close the container is to its own
OOM kill. The kernel keeps the container's figures in its memory cgroup; this module finds that
cgroup (v1's memory controller or the v2 hierarchy) and reads the limit that applies to it (the
lowest on the way up to the root) and what it uses, less the page cache the kernel can drop
(inactive file pages: what `docker stats` also leaves out). The memory guard also reads the
cgroup's own danger signals here: its OOM kills (v2 memory.events, v1 memory.oom_control) and
where its memory PSI file is (v2 memory.pressure).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# v1 reports "no limit" as the largest page-aligned int64; anything this large means unlimited.
UNLIMITED = 1 << 62


@dataclass(frozen=True)
class CgroupMemory:
    path: Path  # the cgroup's folder
    limit: int  # bytes: the lowest limit between this cgroup and the root
    usage: int  # bytes charged to it, page cache included
    reclaimable: int  # inactive file pages: dropped before the OOM killer runs

    @property
    def headroom(self) -> int:
        """Bytes its processes can still take before the limit."""
        return max(0, self.limit - self.usage + self.reclaimable)


def _stat(folder: Path) -> dict[str, int]:
    figures: dict[str, int] = {}
    for line in (folder / "memory.stat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            figures[name] = int(value)
    return figures


def cgroup_mounts(proc: Path) -> list[tuple[str, Path, str, str]]:
    """(root inside the hierarchy, mount point, filesystem type, super options) per cgroup mount."""
    found = []
    for line in (proc / "self" / "mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        parts, rest = fields.split(), tail.split()
        if len(parts) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            found.append((parts[3], Path(parts[4]), rest[0], rest[2]))
    return found


def _inside(mount_root: str, mount_point: Path, path: str) -> Path | None:
    """Where the cgroup `path` (as /proc/self/cgroup names it) lies under this mount."""
    root = mount_root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    return mount_point / path[len(root) :].lstrip("/")


def read_v1(folder: Path) -> CgroupMemory:
    """A cgroup v1 memory controller folder's figures."""
    stat = _stat(folder)
    return CgroupMemory(
        path=folder,
        limit=stat.get("hierarchical_memory_limit", UNLIMITED),
        usage=int((folder / "memory.usage_in_bytes").read_text()),
        reclaimable=stat.get("total_inactive_file", 0),
    )


def read_v2(folder: Path, mount_point: Path) -> CgroupMemory:
    """A cgroup v2 folder's figures; its limit the lowest memory.max up to the mount's root."""
    limit, level = UNLIMITED, folder
    while True:
        text = (
            (level / "memory.max").read_text().strip() if (level / "memory.max").exists() else "max"
        )
        if text != "max":
            limit = min(limit, int(text))
        if level == mount_point:
            break
        level = level.parent
    return CgroupMemory(
        path=folder,
        limit=limit,
        usage=int((folder / "memory.current").read_text()),
        reclaimable=_stat(folder).get("inactive_file", 0),
    )


def _v1_folder(proc: Path, path: str) -> Path | None:
    for root, point, kind, options in cgroup_mounts(proc):
        if kind == "cgroup" and "memory" in options.split(","):
            folder = _inside(root, point, path)
            return folder if folder is not None and (folder / "memory.stat").exists() else None
    return None


def _v2_folder(proc: Path, path: str) -> tuple[Path, Path] | None:
    """(the cgroup's folder, the hierarchy's mount point)."""
    for root, point, kind, _ in cgroup_mounts(proc):
        folder = _inside(root, point, path) if kind == "cgroup2" else None
        if folder is not None and (folder / "memory.current").exists():
            return folder, point
    return None


@dataclass(frozen=True)
class CgroupFolder:
    path: Path
    version: str  # "v1" (the memory controller's hierarchy) or "v2"
    mount_point: Path


def memory_cgroup_folder(proc: Path = Path("/proc")) -> CgroupFolder | None:
    """This process's memory cgroup, with a limit or not; None where there is none to read."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            v1 = path
        elif controllers == "":
            v2 = path
    try:
        if v1 is not None and (found := _v1_folder(proc, v1)) is not None:
            return CgroupFolder(found, "v1", found)
        if v2 is not None and (pair := _v2_folder(proc, v2)) is not None:
            return CgroupFolder(pair[0], "v2", pair[1])
    except (OSError, ValueError):
        return None
    return None


def read_cgroup_memory(proc: Path = Path("/proc")) -> CgroupMemory | None:
    """This process's memory cgroup with a limit, or None: no memory cgroup, or no limit set."""
    folder = memory_cgroup_folder(proc)
    if folder is None:
        return None
    try:
        if folder.version == "v1":
            found = read_v1(folder.path)
        else:
            found = read_v2(folder.path, folder.mount_point)
    except (OSError, ValueError):
        return None
    return found if found.limit < UNLIMITED else None


def read_oom_kills(folder: CgroupFolder) -> int | None:
    """Processes the OOM killer has killed in the cgroup (and below it) since it was made: v2's
    memory.events `oom_kill`, v1's memory.oom_control `oom_kill` (Linux 4.13+); None where the
    kernel gives no count."""
    name = "memory.events" if folder.version == "v2" else "memory.oom_control"
    try:
        for line in (folder.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    except OSError:
        return None
    return None


def pressure_file(folder: CgroupFolder) -> Path | None:
    """The cgroup's own memory PSI file (v2, or v1 on a kernel booted with psi cgroup v1
    support), or None."""
    path = folder.path / "memory.pressure"
    return path if path.is_file() else None
