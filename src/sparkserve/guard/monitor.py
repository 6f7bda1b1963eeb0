"""`sparkserve guard`: stop vLLM before a memory squeeze takes the host down.

On a DGX Spark the GPU's memory is the host's: when vLLM, a client or the page cache push
MemAvailable to nothing, the machine swaps or freezes instead of failing one process. The launchers
start this guard (through its keeper) in the background just before they start vLLM as their child,
watching their own PID, which lives as long as vLLM. Several times a second (faster while
MemAvailable falls towards the floor) it reads this server's memory cgroup first (what is left
under its memory.max, its OOM kills, its memory PSI) and the host's second (MemAvailable,
/proc/vmstat's swap-out, /proc/pressure/memory where the cgroup has no PSI file of its own).
Danger (MemAvailable below the floor, swap-out faster than the limit, memory pressure at its
limit) stops vLLM only once it has held for the danger window (guard/danger.py), so a
neighbour's short spike passes; an emergency stops it at the reading that sees it: the OOM
killer killed a process in this server's cgroup, or MemAvailable fell below half the floor.
Then it

1. logs why, with the numbers, on stderr (the container's log);
2. writes a marker (JSON) to the model-cache volume, on a thread of its own, which the
   launcher reads on its next start and refuses to start until the user sets GUARD_RESUME=1
   (docs/MEMORY.md); it waits at most half a second for the disk before:
3. stops vLLM at once, never letting it drain (sparkserve.guard.stopping): SIGKILL below its API
   server, SIGTERM to the API server, SIGKILL to it after a grace period.

With --textfile-dir it also keeps its state in a Prometheus text file there (guard/textfile.py)
for node-exporter's textfile collector, written by a thread of its own: no disk delays a reading.

It exits as soon as the watched process is gone (polled; plus PR_SET_PDEATHSIG, so that the
kernel signals it when its parent dies: its keeper, or the watched launcher when run
without one), so it never outlives the server.

Run as `python3 -m sparkserve.guard.monitor ...`: this module imports nothing but the standard
library, psutil and small sparkserve modules (host memory, the knob registry, the shared
command-line pieces), so it starts fast and stays small.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparkserve.command_line import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_STOPPED,
    fail,
    one_line_errors,
    ranged,
    sigterm_when_parent_dies,
    standalone,
)
from sparkserve.guard import textfile as guard_textfile
from sparkserve.guard.danger import DANGER_S, Streak, Window
from sparkserve.guard.stopping import Tree, stop
from sparkserve.knobs.registry import BY_NAME
from sparkserve.memory.cgroup import (
    CgroupFolder,
    memory_cgroup_folder,
    pressure_file,
    read_oom_kills,
)
from sparkserve.memory.host import GIB, read_meminfo, read_swap_traffic
from sparkserve.memory.pressure import PSI_MEMORY, read_pressure
from sparkserve.output.atomic_file import replace_text

# The record of a stop, under HF_HOME (the model-cache volume); the launcher gets the full
# path as the start step (sparkserve start) reads it, doctor looks for it too.
MARKER_NAME = "sparkserve/guard-stopped.json"
METRICS_DIR_NAME = "sparkserve/metrics"
PROG = "sparkserve guard"


def marker_path(hf_home: str | Path) -> Path:
    return Path(hf_home) / MARKER_NAME


def metrics_dir(hf_home: str | Path) -> Path:
    """Where the guard keeps its state for node-exporter's textfile collector (the volume)."""
    return Path(hf_home) / METRICS_DIR_NAME


@dataclass(frozen=True)
class Limits:
    floor_bytes: int
    swap_rate_bytes_s: float  # 0: off
    window_s: float = 2.0
    psi_full_pct: float = 0.0  # PSI memory "full" avg10 limit; 0: off
    danger_s: float = DANGER_S  # how long a danger must hold to stop vLLM (guard/danger.py)

    @property
    def hard_floor_bytes(self) -> int:
        """Below this (half the floor) MemAvailable stops vLLM at once, without the window."""
        return self.floor_bytes // 2


@dataclass(frozen=True)
class Trip:
    reason: str
    mem_available_gib: float
    floor_gib: float
    swap_used_gib: float
    swap_out_mb_s: float
    at: float  # time.time()
    psi_full_avg10: float | None = None


class SwapRate:
    """Bytes written to swap per second over a sliding window."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, swapped_out: int) -> float:
        """`swapped_out`: bytes written to swap since boot."""
        self.samples.append((now, swapped_out))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()
        first_t, first_bytes = self.samples[0]
        span = now - first_t
        if span < self.window_s / 2:
            return 0.0
        return (swapped_out - first_bytes) / span


def check(
    limits: Limits,
    available: int,
    swap_used: int,
    swap_rate: float,
    psi_full: float | None = None,
) -> str | None:
    """The reason to stop, or None."""
    found = check_reason(limits, available, swap_used, swap_rate, psi_full)
    return None if found is None else found[1]


def check_reason(
    limits: Limits,
    available: int,
    swap_used: int,
    swap_rate: float,
    psi_full: float | None = None,
    psi_of: str = "the host",
) -> tuple[str, str] | None:
    """(which rule, as guard_textfile.REASONS names it; the reason in words), or None.
    `psi_of`: whose pressure `psi_full` is (this server's cgroup, or the host)."""
    if available < limits.floor_bytes:
        return "mem_available", (
            f"MemAvailable {available / GIB:.2f} GiB fell below the floor "
            f"{limits.floor_bytes / GIB:.2f} GiB (GUARD_FLOOR_GB)"
        )
    if limits.swap_rate_bytes_s > 0 and swap_rate > limits.swap_rate_bytes_s:
        return "swap_out", (
            f"swap-out at {swap_rate / 1e6:.0f} MB/s over {limits.window_s:.0f} s exceeds "
            f"{limits.swap_rate_bytes_s / 1e6:.0f} MB/s (GUARD_SWAP_MB_S); swap used "
            f"{swap_used / GIB:.2f} GiB"
        )
    if limits.psi_full_pct > 0 and psi_full is not None and psi_full >= limits.psi_full_pct:
        return "psi", (
            f"memory pressure of {psi_of} (PSI full avg10) at {psi_full:.1f} % reached "
            f"{limits.psi_full_pct:g} % (GUARD_PSI_PCT); MemAvailable {available / GIB:.2f} GiB"
        )
    return None


def emergency(limits: Limits, available: int, oom_kills: int) -> tuple[str, str] | None:
    """What stops vLLM at once, without the danger window: (rule, reason), or None.
    `oom_kills`: processes the OOM killer killed in this server's cgroup since the guard began."""
    if oom_kills > 0:
        return "oom_kill", (
            f"the OOM killer killed {oom_kills} process(es) in this server's memory cgroup "
            "(its oom_kill count)"
        )
    if available < limits.hard_floor_bytes:
        return "mem_available", (
            f"MemAvailable {available / GIB:.2f} GiB fell below half the floor "
            f"({limits.hard_floor_bytes / GIB:.2f} GiB of {limits.floor_bytes / GIB:.2f} GiB, "
            "GUARD_FLOOR_GB): an emergency, no danger window"
        )
    return None


def next_wait(interval_s: float, available: int, floor: int, falling_bytes_s: float) -> float:
    """Seconds to the next reading: the interval, shortened to half the time MemAvailable
    would need to reach `floor` (the next level that acts) at its current fall rate (a fast
    hog is met early)."""
    if falling_bytes_s <= 0:
        return interval_s
    return min(interval_s, max(0.01, (available - floor) / falling_bytes_s / 2))


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{PROG}: {stamp} {message}", file=sys.stderr, flush=True)


def write_marker(path: Path | None, trip: Trip, pid: int) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        record: dict[str, Any] = asdict(trip) | {"pid": pid, "time": time.ctime(trip.at)}
        replace_text(path, json.dumps(record, indent=1) + "\n")
    except OSError as error:
        log(f"could not write the marker {path}: {error.strerror}")
    else:
        log(f"wrote {path}; the next start refuses until GUARD_RESUME=1 (docs/MEMORY.md)")


class Beat:
    """One byte down the keeper's pipe at each reading: the keeper's proof that this guard
    still samples (guard/keeper.py). Closed before a stop, which may take the grace: the
    keeper then waits for the exit instead of judging silence."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        if fd is not None:
            os.set_blocking(fd, False)  # a full pipe must never stall a reading

    def __call__(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(BlockingIOError, BrokenPipeError):
                os.write(self.fd, b".")

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


def _die_with_parent(pid: int) -> None:
    """Ask the kernel to SIGTERM us when our parent (the watched process) dies."""
    if os.getppid() == pid and not sigterm_when_parent_dies(pid):
        sys.exit(EXIT_OK)


def watch(
    pid: int,
    limits: Limits,
    interval_s: float,
    grace_s: float,
    marker: Path | None,
    textfile_dir: Path | None = None,
    os_reserve_bytes: int = 0,
    beat_fd: int | None = None,
) -> int:
    state = state_of(limits, os_reserve_bytes)
    beat = Beat(beat_fd)
    writer = guard_textfile.StateWriter(textfile_dir)
    try:
        return _watch(pid, limits, interval_s, grace_s, marker, state, writer, beat)
    finally:
        beat.close()
        state.watching = False
        if not writer.close(STATE_CLOSE_S, state):
            log(f"could not write the state file in {textfile_dir} within {STATE_CLOSE_S:.0f} s")


STATE_CLOSE_S = 5.0  # the most the guard's exit waits for its last state to reach the disk
# The record of a stop must be on the volume before the launcher exits (the container's end
# takes the guard with it), yet a slow disk must not hold the stop: it is written on a thread,
# waited for up to MARKER_FIRST_S before the stop and up to MARKER_WAIT_S after it.
MARKER_FIRST_S = 0.5
MARKER_WAIT_S = 30.0


class Signals:
    """This server's memory cgroup first, the host second: where the guard reads what."""

    def __init__(self) -> None:
        self.cgroup: CgroupFolder | None = memory_cgroup_folder()
        own = None if self.cgroup is None else pressure_file(self.cgroup)
        self.psi_path = own or PSI_MEMORY
        self.psi_of = "this server's cgroup" if own else "the host"
        self.oom_kills_at_start = self._oom_kills_now() or 0

    def _oom_kills_now(self) -> int | None:
        return None if self.cgroup is None else read_oom_kills(self.cgroup)

    def oom_kills(self) -> int:
        """OOM kills in this server's cgroup since the guard began."""
        now = self._oom_kills_now()
        return 0 if now is None else max(0, now - self.oom_kills_at_start)

    def psi_full(self) -> float | None:
        pressure = read_pressure(self.psi_path)
        return None if pressure is None else pressure.full_avg10

    def describe(self) -> str:
        if self.cgroup is None:
            return "no memory cgroup (host signals only)"
        kills = "its OOM kills" if self._oom_kills_now() is not None else "no OOM kill count"
        return f"memory cgroup {self.cgroup.path} ({self.cgroup.version}: {kills})"


def _watch(
    pid: int,
    limits: Limits,
    interval_s: float,
    grace_s: float,
    marker: Path | None,
    state: guard_textfile.GuardState,
    writer: guard_textfile.StateWriter,
    beat: Beat,
) -> int:
    tree = Tree(pid)
    if not tree.top_alive():
        log(f"pid {pid} is not running; nothing to guard")
        return EXIT_OK
    _die_with_parent(pid)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(EXIT_OK))
    signals = Signals()
    rate = SwapRate(limits.window_s)
    window = Window(limits.danger_s)
    limit = read_meminfo().cgroup_limit
    log(
        f"watching pid {pid}: floor {limits.floor_bytes / GIB:.2f} GiB MemAvailable"
        f"{'' if limit is None else f' (or left under its cgroup limit, {limit / GIB:.2f} GiB)'}, "
        f"swap-out limit {limits.swap_rate_bytes_s / 1e6:.0f} MB/s "
        f"({'off' if limits.swap_rate_bytes_s <= 0 else f'over {limits.window_s:.0f} s'}), "
        f"PSI full avg10 limit {limits.psi_full_pct:g} % of {signals.psi_of}"
        f"{' (off)' if limits.psi_full_pct <= 0 else ''}; a danger stops vLLM once it held "
        f"{limits.danger_s:g} s, an OOM kill in its cgroup or MemAvailable under "
        f"{limits.hard_floor_bytes / GIB:.2f} GiB at once; {signals.describe()}; "
        f"every {interval_s:.2f} s"
    )
    last: tuple[float, int] | None = None
    written = 0.0
    streak: Streak | None = None
    while tree.top_alive():
        beat()
        mem = read_meminfo()
        now = time.monotonic()
        swap_rate = rate.add(now, read_swap_traffic().swapped_out)
        psi_full = signals.psi_full()
        urgent = emergency(limits, mem.available, signals.oom_kills())
        found = check_reason(
            limits, mem.available, mem.swap_used, swap_rate, psi_full, signals.psi_of
        )
        before, streak = streak, window.add(now, found)
        state.mem_available_bytes, state.psi_full_avg10 = mem.available, psi_full
        state.danger_s = 0.0 if streak is None else streak.held_s
        if before is None and streak is not None and not urgent:
            log(f"danger: {streak.reason}; vLLM stops if this holds {limits.danger_s:g} s")
        elif before is not None and streak is None:
            log(f"danger passed after {now - before.began:.2f} s: {before.reason}")
        if urgent is not None or window.over(streak):
            if urgent is not None:
                rule, reason = urgent
            else:
                assert streak is not None
                rule = streak.rule
                reason = f"{streak.reason}; in danger for {streak.held_s:.1f} s"
            trip = Trip(
                reason=reason,
                mem_available_gib=round(mem.available / GIB, 3),
                floor_gib=round(limits.floor_bytes / GIB, 3),
                swap_used_gib=round(mem.swap_used / GIB, 3),
                swap_out_mb_s=round(swap_rate / 1e6, 1),
                at=time.time(),
                psi_full_avg10=psi_full,
            )
            log(
                f"stopping vLLM (pid {pid}): {reason}; MemAvailable "
                f"{trip.mem_available_gib:.2f} GiB of {mem.total / GIB:.1f}, swap used "
                f"{trip.swap_used_gib:.2f} GiB, swap-out {trip.swap_out_mb_s:.0f} MB/s "
                f"(at {trip.at:.3f})"
            )
            return _stop(tree, pid, grace_s, marker, trip, rule, state, writer, beat)
        if now - written >= 1.0:
            writer.post(state)
            tree.refresh()  # vLLM's processes, remembered for a stop
            written = now
        falling = 0.0 if last is None else (last[1] - mem.available) / max(now - last[0], 1e-3)
        last = (now, mem.available)
        # The next level that acts: the floor (a streak begins), then half of it (at once).
        level = (
            limits.floor_bytes if mem.available >= limits.floor_bytes else limits.hard_floor_bytes
        )
        time.sleep(next_wait(interval_s, mem.available, level, falling))
    return EXIT_OK


def _stop(
    tree: Tree,
    pid: int,
    grace_s: float,
    marker: Path | None,
    trip: Trip,
    rule: str,
    state: guard_textfile.GuardState,
    writer: guard_textfile.StateWriter,
    beat: Beat,
) -> int:
    """Stop vLLM; the record is written on a thread (MARKER_FIRST_S, MARKER_WAIT_S)."""
    recording = threading.Thread(target=write_marker, args=(marker, trip, pid), daemon=True)
    recording.start()
    state.tripped, state.trip_time = rule, trip.at
    writer.post(state)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # our parent's death is expected now
    beat.close()  # the keeper now waits for our exit instead of judging silence
    recording.join(MARKER_FIRST_S)
    how = stop(tree, grace_s)
    log(f"vLLM (pid {pid}) {how}")
    recording.join(MARKER_WAIT_S)
    if recording.is_alive():
        log(f"the record {marker} was not written within {MARKER_WAIT_S:.0f} s (the disk)")
    return EXIT_STOPPED


# ---------------------------------------------------------------- command line


def _knob_option(name: str, option: str) -> dict[str, Any]:
    """argparse settings for an option that carries a knob: its range and its default."""
    knob = BY_NAME[name]
    low, high = knob.minimum or 0.0, knob.maximum or float("inf")
    default = float(knob.default) if knob.default else None
    return {"type": ranged(float, option, low, high), "default": default}


def configure(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--pid", type=int, required=True, help="the process to guard (the launcher's $$)")
    add(
        "--floor-gb",
        default="",
        help="stop when MemAvailable falls below this many GiB (empty: half of --os-reserve-gb)",
    )
    add("--os-reserve-gb", **_knob_option("OS_RESERVE_GB", "--os-reserve-gb"))
    add(
        "--swap-mb-s",
        **_knob_option("GUARD_SWAP_MB_S", "--swap-mb-s"),
        help="stop when swap-out exceeds this many MB/s over --window-s (0: off)",
    )

    def seconds(option: str, low: float, high: float, default: float, what: str) -> None:
        add(option, type=ranged(float, option, low, high), default=default, help=what)

    seconds("--window-s", 0.5, 60, 2.0, "seconds over which the swap-out rate is measured")
    seconds("--danger-s", 0, 60, DANGER_S, "seconds a danger must hold to stop vLLM (0: at once)")
    add(
        "--psi-full-pct",
        **_knob_option("GUARD_PSI_PCT", "--psi-full-pct"),
        help="stop when PSI memory 'full' avg10 reaches this many percent (0: off)",
    )
    seconds("--interval-s", 0.05, 10, 0.2, "seconds between readings (less while memory falls)")
    add(
        "--beat-fd",
        type=int,
        default=None,
        help="write one byte to this file descriptor at each reading (the keeper's hang check)",
    )
    seconds("--grace-s", 0, 600, 15.0, "seconds between SIGTERM and SIGKILL")
    add(
        "--marker",
        type=Path,
        default=None,
        help="file to record a stop in (the launcher passes $HF_HOME/" + MARKER_NAME + ")",
    )
    add(
        "--textfile-dir",
        type=Path,
        default=None,
        help="keep the guard's state in DIR/guard.prom for node-exporter's textfile collector",
    )
    one_line_errors(parser, PROG)


def limits_of(args: argparse.Namespace) -> Limits:
    """The limits the options set (an empty --floor-gb: half of --os-reserve-gb)."""
    floor_text = str(args.floor_gb).strip()
    if floor_text:
        floor_gib = _knob_option("GUARD_FLOOR_GB", "--floor-gb")["type"](floor_text)
    else:
        floor_gib = args.os_reserve_gb / 2
    return Limits(
        floor_bytes=int(floor_gib * GIB),
        swap_rate_bytes_s=args.swap_mb_s * 1e6,
        window_s=args.window_s,
        psi_full_pct=args.psi_full_pct,
        danger_s=args.danger_s,
    )


def state_of(limits: Limits, os_reserve_bytes: int) -> guard_textfile.GuardState:
    """What the state file says before the first reading."""
    return guard_textfile.GuardState(
        floor_bytes=limits.floor_bytes,
        os_reserve_bytes=os_reserve_bytes,
        swap_limit_bytes_s=limits.swap_rate_bytes_s,
        psi_limit_pct=limits.psi_full_pct,
    )


def run(args: argparse.Namespace) -> int:
    return watch(
        args.pid, limits_of(args), args.interval_s, args.grace_s, args.marker,
        args.textfile_dir, int(args.os_reserve_gb * GIB), args.beat_fd,
    )  # fmt: skip


def _run_checked(args: argparse.Namespace) -> int:
    try:
        return run(args)
    except argparse.ArgumentTypeError as error:
        return fail(PROG, error, EXIT_BAD_INPUT)


def add_command(commands: Any) -> None:
    parser = commands.add_parser(
        "guard", help="stop vLLM when available memory or swap says the host is in danger"
    )
    configure(parser)
    parser.set_defaults(run=_run_checked)


def main(argv: list[str] | None = None) -> int:
    return standalone(PROG, __doc__ or PROG, configure, _run_checked, argv)


if __name__ == "__main__":
    sys.exit(main())
