"""The host's memory, read straight from /proc (cheap enough to sample several times a second)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
PAGE = 4096  # /proc/vmstat counts pswpout in pages


@dataclass(frozen=True)
class MemInfo:
    total: int  # bytes
    available: int
    swap_total: int
    swap_free: int

    @property
    def swap_used(self) -> int:
        return self.swap_total - self.swap_free


def read_meminfo(path: Path = Path("/proc/meminfo")) -> MemInfo:
    """MemTotal, MemAvailable and swap in bytes; ValueError naming the file on a bad one."""
    fields: dict[str, int] = {}
    with path.open("rb") as handle:
        for line in handle:
            name, _, rest = line.partition(b":")
            if name in (b"MemTotal", b"MemAvailable", b"SwapTotal", b"SwapFree"):
                fields[name.decode()] = int(rest.split()[0]) * 1024
    missing = {"MemTotal", "MemAvailable"} - fields.keys()
    if missing:
        raise ValueError(f"{path}: no {' or '.join(sorted(missing))} line")
    return MemInfo(
        total=fields["MemTotal"],
        available=fields["MemAvailable"],
        swap_total=fields.get("SwapTotal", 0),
        swap_free=fields.get("SwapFree", 0),
    )


def read_swap_out_pages(path: Path = Path("/proc/vmstat")) -> int:
    """Pages written to swap since boot (pswpout); 0 where the kernel has no such line."""
    with path.open("rb") as handle:
        for line in handle:
            if line.startswith(b"pswpout "):
                return int(line.split()[1])
    return 0


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"
