"""Host memory (and GPU memory where nvidia-smi reports it), sampled at a fixed rate.

Host figures come from sparkserve.memory.host: MemAvailable, used (total - MemAvailable), swap
used, the swap-in/out rates from the kernel's swap counters, and memory pressure (PSI: the
share of each interval tasks stalled on memory). They are read in a process of their own
(host_probe.py), so load on this one cannot slow the sampling down. nvidia-smi is slow (tens
of ms a call), so it runs in its own thread at most once a second; on a DGX Spark it usually
says [N/A] for memory.used, and then the per-process figures are summed instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sparkserve.memory.host import GIB, MIB, read_meminfo


@dataclass
class Sample:
    t: float  # seconds since the sampler started
    mem_available_gib: float
    mem_used_gib: float
    swap_used_gib: float
    swap_in_mib_s: float
    swap_out_mib_s: float
    gpu_used_gib: float | None = None
    kv_usage: float | None = None  # vllm:kv_cache_usage_perc (0..1), last seen
    phase: str = ""
    psi_some_pct: float | None = None  # % of the interval some task stalled on memory
    psi_full_pct: float | None = None  # % of the interval every task did

    def row(self) -> dict[str, object]:
        return asdict(self)


def gpu_used_gib(nvidia_smi: str) -> float | None:
    """GPU memory in use per nvidia-smi: the device figure, else the per-process sum."""
    queries = (
        ["--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        ["--query-compute-apps=used_memory", "--format=csv,noheader,nounits"],
    )
    for query in queries:
        try:
            done = subprocess.run(
                [nvidia_smi, *query], capture_output=True, text=True, timeout=5, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        values = []
        for line in done.stdout.splitlines():
            with contextlib.suppress(ValueError):
                values.append(float(line.strip()))
        if done.returncode == 0 and values:
            return sum(values) * MIB / GIB
    return None


class MemorySampler:
    """Samples on a background thread at `hz`; `phase()` tags what follows."""

    def __init__(
        self,
        hz: float = 10.0,
        *,
        nvidia_smi: str | None = "auto",
        kv_probe: Callable[[], float | None] | None = None,
    ) -> None:
        if hz <= 0:
            raise ValueError(f"sample rate {hz!r}: must be above 0")
        self.hz = hz
        self.samples: list[Sample] = []
        memory = read_meminfo()
        self.total_gib = memory.total / GIB
        self.swap_total_gib = memory.swap_total / GIB
        smi = shutil.which("nvidia-smi") if nvidia_smi == "auto" else nvidia_smi
        self.nvidia_smi = smi or None
        self.gpu_note = "" if self.nvidia_smi else "nvidia-smi not found"
        self._gpu: float | None = None
        self._kv: float | None = None
        self._kv_probe = kv_probe
        self._phase = ""
        self._phases: list[tuple[float, str]] = []  # (monotonic time, phase from then on)
        self._probe: subprocess.Popen[str] | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.t0 = 0.0

    def phase(self, name: str) -> None:
        with self._lock:
            self._phases.append((time.monotonic(), name))
        self._phase = name

    def _phase_at(self, when: float) -> str:
        with self._lock:
            names = [name for at, name in self._phases if at <= when]
        return names[-1] if names else ""

    def now(self) -> float:
        return time.monotonic() - self.t0

    def start(self) -> MemorySampler:
        self.t0 = time.monotonic()
        self._probe = subprocess.Popen(
            [sys.executable, "-m", "sparkserve.stress.host_probe", str(self.hz)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_probe_env(),
        )  # fmt: skip
        self._threads = [threading.Thread(target=self._host_loop, daemon=True, name="mem")]
        if self.nvidia_smi:
            self._threads.append(threading.Thread(target=self._gpu_loop, daemon=True))
        if self._kv_probe is not None:
            self._threads.append(threading.Thread(target=self._kv_loop, daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        if self._probe is not None:
            with contextlib.suppress(OSError):
                self._probe.stdin.close()  # type: ignore[union-attr]
            try:
                self._probe.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._probe.kill()
                self._probe.wait()
        for thread in self._threads:
            thread.join(timeout=6)
        with self._lock:
            return list(self.samples)

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)

    def _host_loop(self) -> None:
        """Turn the probe's lines into samples, tagged with the phase of their moment."""
        assert self._probe is not None and self._probe.stdout is not None
        for line in self._probe.stdout:
            at, available, used, swap, rate_in, rate_out, psi_some, psi_full = json.loads(line)
            sample = Sample(
                t=round(at - self.t0, 4),
                mem_available_gib=available,
                mem_used_gib=used,
                swap_used_gib=swap,
                swap_in_mib_s=rate_in,
                swap_out_mib_s=rate_out,
                gpu_used_gib=self._gpu,
                kv_usage=self._kv,
                phase=self._phase_at(at),
                psi_some_pct=psi_some,
                psi_full_pct=psi_full,
            )
            with self._lock:
                self.samples.append(sample)

    def _gpu_loop(self) -> None:
        assert self.nvidia_smi is not None
        while not self._stop.is_set():
            value = gpu_used_gib(self.nvidia_smi)
            if value is None and self._gpu is None:
                self.gpu_note = "nvidia-smi reports no memory figure"
            self._gpu = value
            self._stop.wait(1.0)

    def _kv_loop(self) -> None:
        assert self._kv_probe is not None
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self._kv = self._kv_probe()
            self._stop.wait(0.5)


def _probe_env() -> dict[str, str]:
    """This environment, with sparkserve importable by the probe however we were started."""
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, path) if p))
