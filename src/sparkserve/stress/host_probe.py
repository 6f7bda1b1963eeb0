"""The memory sampler's own process: reads host memory at a fixed rate, one JSON line each.

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

from sparkserve.memory.host import GIB, MIB, read_meminfo, read_swap_traffic
from sparkserve.memory.pressure import StallRate, read_pressure


def sample_forever(hz: float) -> None:
    stop = threading.Event()

    def watch_stdin() -> None:  # the parent closed our stdin (or died): stop
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    period = 1.0 / hz
    stalls = StallRate()
    prev = read_swap_traffic()
    prev_t = tick = time.monotonic()
    first = True
    while not stop.is_set():
        now = time.monotonic()
        memory = read_meminfo()
        available, used, swap = (x / GIB for x in (memory.available, memory.used, memory.swap_used))
        traffic = read_swap_traffic()
        pressure = read_pressure()
        dt = max(now - prev_t, 1e-6)
        rate_in = (traffic.swapped_in - prev.swapped_in) / MIB / dt
        rate_out = (traffic.swapped_out - prev.swapped_out) / MIB / dt
        prev, prev_t = traffic, now
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
    sample_forever(float(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
