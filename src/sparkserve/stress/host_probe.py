"""The memory sampler's own process: reads /proc at a fixed rate, one JSON line per sample.

`sparkserve stress` drives the server from threads of its own process; under memory pressure
on a small machine those threads and the GIL slowed an in-process sampler well below its rate
(5.9 Hz instead of 10 on 2 cores). This process does nothing else, keeps to its schedule from
the monotonic clock (shared by every process, so the parent can place each sample in its
phases), and exits when its parent stops reading (broken pipe) or closes its stdin.

Each line: [t_monotonic, available, used, swap_used (GiB), swap_in, swap_out (MiB/s),
psi_some, psi_full (percent of the interval stalled on memory; null without PSI)].
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from sparkserve.memory.pressure import StallRate, read_pressure
from sparkserve.stress.sampler import MIB, PAGE, host_figures, read_meminfo, read_vmstat


def sample_forever(hz: float, meminfo: Path, vmstat: Path) -> None:
    stop = threading.Event()

    def watch_stdin() -> None:  # the parent closed our stdin (or died): stop
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    period = 1.0 / hz
    stalls = StallRate()
    prev = read_vmstat(vmstat)
    prev_t = tick = time.monotonic()
    first = True
    while not stop.is_set():
        now = time.monotonic()
        _, available, used, swap = host_figures(read_meminfo(meminfo))
        vm = read_vmstat(vmstat)
        pressure = read_pressure()
        dt = max(now - prev_t, 1e-6)
        rate_in = (vm.get("pswpin", 0) - prev.get("pswpin", 0)) * PAGE / MIB / dt
        rate_out = (vm.get("pswpout", 0) - prev.get("pswpout", 0)) * PAGE / MIB / dt
        prev, prev_t = vm, now
        psi: list[float | None] = [None, None]
        if pressure is not None:
            some, full = stalls.add(now, pressure)
            psi = [None, None] if first else [round(some * 100, 3), round(full * 100, 3)]
        row = [round(now, 6), available, used, swap, 0.0 if first else rate_in]
        row += [0.0 if first else rate_out, *psi]
        first = False
        try:
            sys.stdout.write(json.dumps(row) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            return
        # Keep to the schedule (no drift); skip ticks already missed.
        tick += period
        late = time.monotonic() - tick
        if late > 0:
            tick += period * (late // period + 1)
        stop.wait(max(tick - time.monotonic(), 0.0))


def main(argv: list[str]) -> int:
    hz, meminfo, vmstat = float(argv[0]), Path(argv[1]), Path(argv[2])
    sample_forever(hz, meminfo, vmstat)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
