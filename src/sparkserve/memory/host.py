"""The host's memory: psutil for the figures, /proc/vmstat for the swap traffic.

psutil turns /proc/vmstat's pswpin/pswpout page counts into bytes at 4 KiB a page; an arm64
kernel may use 16 or 64 KiB pages, so the swap counters are read here and scaled by the
page size the kernel reports. Both reads are cheap enough to sample several times a second.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

GIB = 1024**3
MIB = 1024**2
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class MemInfo:
    total: int  # bytes
    available: int  # MemAvailable
    used: int  # total - available (psutil's figure)
    swap_total: int
    swap_used: int


def read_meminfo() -> MemInfo:
    """This host's memory now, in bytes."""
    memory = psutil.virtual_memory()
    swap = psutil.swap_memory()
    return MemInfo(
        total=memory.total,
        available=memory.available,
        used=memory.used,
        swap_total=swap.total,
        swap_used=swap.used,
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
