"""The host's memory: psutil for the figures, /proc/vmstat for the swap traffic.

What is available is the host's MemAvailable, or less where this process's memory cgroup (a
container's memory limit) leaves less under its limit (sparkserve.memory.cgroup): the guard,
the stress run and the tune judge the memory their server may really use.

psutil turns /proc/vmstat's pswpin/pswpout page counts into bytes at 4 KiB a page; an arm64
kernel may use 16 or 64 KiB pages, so the swap counters are read here and scaled by the
page size the kernel reports. Both reads are cheap enough to sample several times a second.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from sparkserve.memory.cgroup import read_cgroup_memory

GIB = 1024**3
MIB = 1024**2
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class MemInfo:
    total: int  # bytes: the host's
    available: int  # MemAvailable, or the cgroup's headroom where that is less
    used: int  # total - available (psutil's figure)
    swap_total: int
    swap_used: int
    cgroup_limit: int | None = None  # bytes, where a memory cgroup limits this process


def read_meminfo() -> MemInfo:
    """This host's memory now, in bytes; what is available as seen from this process's cgroup."""
    memory = psutil.virtual_memory()
    swap = psutil.swap_memory()
    cgroup = read_cgroup_memory(Path(psutil.PROCFS_PATH))
    return MemInfo(
        total=memory.total,
        available=min(memory.available, cgroup.headroom) if cgroup else memory.available,
        used=memory.used,
        swap_total=swap.total,
        swap_used=swap.used,
        cgroup_limit=cgroup.limit if cgroup and cgroup.limit < memory.total else None,
    )


@dataclass(frozen=True)
class SwapTraffic:
    swapped_in: int  # bytes since boot
    swapped_out: int


def read_swap_traffic(path: Path = Path("/proc/vmstat")) -> SwapTraffic:
    """Bytes read from and written to swap since boot; 0 where the kernel has no such line."""
    pages = {b"pswpin": 0, b"pswpout": 0}
    with path.open("rb") as handle:
        for line in handle:
            name, _, value = line.partition(b" ")
            if name in pages:
                pages[name] = int(value)
    return SwapTraffic(pages[b"pswpin"] * PAGE_BYTES, pages[b"pswpout"] * PAGE_BYTES)


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"
