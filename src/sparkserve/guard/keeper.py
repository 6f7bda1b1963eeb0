"""`python3 -m sparkserve.guard.keeper`: keep the memory guard alive for as long as vLLM runs.

vLLM without its guard can freeze a Spark (its GPU memory is the host's), and a guard can die
while vLLM runs: `kill -9`, the OOM killer, a crash. The launchers start this keeper with the
guard's own options; it runs the guard (`python3 -m sparkserve.guard.monitor`) as its child, and

- the guard exits 0 and vLLM is gone: the keeper exits 0;
- the guard stopped vLLM (exit 3): the keeper exits 3;
- the guard is gone while vLLM still runs (killed by a signal, crashed, or exited): the keeper
  says so on stderr, marks the state file `watching 0` and starts a new guard at once;
- the guard is alive but has taken no reading for HUNG_AFTER_S (stopped, stuck in a read, or
  starved): the keeper kills it and treats it as a death;
- the guard died more than RESTARTS times within WINDOW_S: something keeps killing it, so the
  keeper stops vLLM itself, as the guard would (sparkserve.guard.stopping), and exits 3.

Restart, not stop, is the first answer: a guard killed by a stray `kill -9` is back within a
second, while stopping vLLM would cut every stream and reload the model for minutes. A guard
that cannot stay alive protects nothing, and then the server stops. The guard writes a byte
down a pipe at each reading; the keeper blocks in select() on it, so it notices a death (the
pipe's end) at once, a hang within HUNG_AFTER_S, and costs almost no CPU. HUNG_AFTER_S (15 s)
is half of GuardStateStale's 30 s: a hang the keeper mends never fires the alert. If the keeper
itself is killed, the guard keeps guarding; if both are, the state file goes stale and
Prometheus's GuardStateStale alert fires (docs/METRICS.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections import deque

from sparkserve.command_line import EXIT_BAD_INPUT, EXIT_OK, EXIT_STOPPED, fail, standalone
from sparkserve.guard import monitor as guard
from sparkserve.guard import textfile as guard_textfile
from sparkserve.guard.stopping import Tree, stop
from sparkserve.memory.host import GIB

PROG = "sparkserve guard keeper"
RESTARTS = 3  # guard deaths forgiven within WINDOW_S; one more stops vLLM
WINDOW_S = 600.0
HUNG_AFTER_S = 15.0  # no reading for this long (or 3 intervals, if longer): the guard is hung


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{PROG}: {stamp} {message}", file=sys.stderr, flush=True)


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
        return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def run_guard(argv: list[str], hung_after_s: float) -> tuple[int, int | None]:
    """Run one guard with `argv` until it exits; its pid and exit status, or None when it took
    no reading for `hung_after_s` and was killed here."""
    beats, beat_end = os.pipe()
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "sparkserve.guard.monitor", *argv, "--beat-fd", str(beat_end)],
            stdin=subprocess.DEVNULL,
            pass_fds=(beat_end,),
        )
    except BaseException:
        os.close(beats)
        raise
    finally:
        os.close(beat_end)
    with open(beats, "rb", buffering=0) as pipe:
        while True:
            ready, _, _ = select.select([pipe], [], [], hung_after_s)
            if not ready:
                child.kill()
                child.wait()
                return child.pid, None
            if not pipe.read(4096):  # the guard's end closed: it exited, or it is stopping vLLM
                return child.pid, child.wait()


def keep(argv: list[str], args: argparse.Namespace) -> int:
    """Run the guard with `argv` (its options) until vLLM (args.pid) is gone."""
    tree = Tree(args.pid)
    state = guard.state_of(guard.limits_of(args), int(args.os_reserve_gb * GIB))
    hung_after_s = max(HUNG_AFTER_S, 3 * args.interval_s)
    deaths: deque[float] = deque()
    # The state file by a thread of its own, as the guard does: a slow disk must not delay the
    # next guard's start.
    writer = guard_textfile.StateWriter(args.textfile_dir)
    try:
        return _keep(argv, args, tree, state, hung_after_s, deaths, writer)
    finally:
        writer.close(guard.STATE_CLOSE_S)  # what it posted; never over the guard's last


def _keep(
    argv: list[str],
    args: argparse.Namespace,
    tree: Tree,
    state: guard_textfile.GuardState,
    hung_after_s: float,
    deaths: deque[float],
    writer: guard_textfile.StateWriter,
) -> int:
    while True:
        pid, returncode = run_guard(argv, hung_after_s)
        if returncode == EXIT_STOPPED:
            return EXIT_STOPPED
        if not tree.top_alive():
            return EXIT_OK
        # The guard is gone and vLLM runs unguarded: say so, in the state file too.
        state.watching = False
        writer.post(state)
        now = time.monotonic()
        deaths.append(now)
        while deaths and now - deaths[0] > WINDOW_S:
            deaths.popleft()
        how = (
            f"took no reading for {hung_after_s:.0f} s (hung) and was killed"
            if returncode is None
            else how_it_ended(returncode)
        )
        if len(deaths) > RESTARTS:
            log(
                f"the memory guard (pid {pid}) {how}, its "
                f"{len(deaths)}th death in {WINDOW_S:.0f} s; stopping vLLM (pid {args.pid}): "
                "it must not run unguarded"
            )
            log(f"vLLM (pid {args.pid}) {stop(tree, args.grace_s)}")
            return EXIT_STOPPED
        log(
            f"the memory guard (pid {pid}) {how} while vLLM (pid "
            f"{args.pid}) runs; starting a new one ({len(deaths)} of {RESTARTS} restarts "
            f"allowed in {WINDOW_S:.0f} s)"
        )


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        guard.limits_of(args)  # a bad --floor-gb is one line here, not a crash loop
    except argparse.ArgumentTypeError as error:
        return fail(PROG, error, EXIT_BAD_INPUT)
    return keep(argv, args)


def main(argv: list[str] | None = None) -> int:
    options = sys.argv[1:] if argv is None else argv
    doc = __doc__ or PROG
    return standalone(PROG, doc, guard.configure, lambda args: _run(args, options), options)


if __name__ == "__main__":
    sys.exit(main())
