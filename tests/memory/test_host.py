"""The host's memory through psutil and the kernel's swap counters (sparkserve.memory.host)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from sparkserve.memory.host import (
    GIB,
    PAGE_BYTES,
    SwapTraffic,
    read_meminfo,
    read_swap_traffic,
)


def test_host_figures_from_meminfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "meminfo").write_text(
        "MemTotal: 8388608 kB\nMemFree: 1048576 kB\nMemAvailable: 4194304 kB\n"
        "Buffers: 0 kB\nCached: 2097152 kB\nSReclaimable: 0 kB\n"
        "SwapTotal: 2097152 kB\nSwapFree: 1048576 kB\n"
        "Shmem: 0 kB\nActive: 0 kB\nInactive: 0 kB\n"
    )
    (tmp_path / "vmstat").write_text("pgpgin 7\npswpin 10\npswpout 20\n")
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))  # psutil reads this "/proc"
    memory = read_meminfo()
    figures = (memory.total, memory.available, memory.used, memory.swap_used)
    assert tuple(value / GIB for value in figures) == (8.0, 4.0, 4.0, 1.0)  # used: total - avail
    assert read_swap_traffic(tmp_path / "vmstat") == SwapTraffic(10 * PAGE_BYTES, 20 * PAGE_BYTES)
