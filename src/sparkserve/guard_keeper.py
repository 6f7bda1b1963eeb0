"""`python3 -m sparkserve.guard_keeper`: keep the memory guard alive for as long as vLLM runs.

vLLM without its guard can freeze a Spark (its GPU memory is the host's), and a guard can die
while vLLM runs: `kill -9`, the OOM killer, a crash. The launchers start this keeper with the
guard's own options; it runs the guard (`python3 -m sparkserve.guard`) as its child, and

- the guard exits 0 and vLLM is gone: the keeper exits 0;
- the guard stopped vLLM (exit 3): the keeper exits 3;
- the guard is gone while vLLM still runs (killed by a signal, crashed, or exited): the keeper
  says so on stderr, marks the state file `watching 0` and starts a new guard at once;
- the guard died more than RESTARTS times within WINDOW_S: something keeps killing it, so the
  keeper stops vLLM itself, as the guard would (sparkserve.stopping), and exits 3.

Restart, not stop, is the first answer: a guard killed by a stray `kill -9` is back within a
second, while stopping vLLM would cut every stream and reload the model for minutes. A guard
that cannot stay alive protects nothing, and then the server stops. The keeper blocks in wait()
on its child, so it notices a death at once and costs no CPU between deaths. If the keeper
itself is killed, the guard keeps guarding; if both are, the state file goes stale and
Prometheus's GuardStateStale alert fires (docs/METRICS.md).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from sparkserve import guard, guard_textfile
from sparkserve.command_line import EXIT_BAD_INPUT, EXIT_OK, EXIT_STOPPED, fail, standalone
from sparkserve.memory.host import GIB
from sparkserve.stopping import Tree, stop

PROG = "sparkserve guard keeper"
RESTARTS = 3  # guard deaths forgiven within WINDOW_S; one more stops vLLM
WINDOW_S = 600.0


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{PROG}: {stamp} {message}", file=sys.stderr, flush=True)


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
        return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def keep(argv: list[str], args: argparse.Namespace) -> int:
    """Run the guard with `argv` (its options) until vLLM (args.pid) is gone."""
    tree = Tree(args.pid)
    state = guard.state_of(guard.limits_of(args), int(args.os_reserve_gb * GIB))
    deaths: deque[float] = deque()
    with contextlib.suppress(OSError):  # as the guard: the last thing the OOM killer picks
        Path("/proc/self/oom_score_adj").write_text("-500")
    while True:
        child = subprocess.Popen(
            [sys.executable, "-m", "sparkserve.guard", *argv], stdin=subprocess.DEVNULL
        )
        returncode = child.wait()
        if returncode == EXIT_STOPPED:
            return EXIT_STOPPED
        if not tree.top_alive():
            return EXIT_OK
        # The guard is gone and vLLM runs unguarded: say so, in the state file too.
        state.watching = False
        guard_textfile.write(args.textfile_dir, state)
        now = time.monotonic()
        deaths.append(now)
        while deaths and now - deaths[0] > WINDOW_S:
            deaths.popleft()
        if len(deaths) > RESTARTS:
            log(
                f"the memory guard (pid {child.pid}) {how_it_ended(returncode)}, its "
                f"{len(deaths)}th death in {WINDOW_S:.0f} s; stopping vLLM (pid {args.pid}): "
                "it must not run unguarded"
            )
            log(f"vLLM (pid {args.pid}) {stop(tree, args.grace_s)}")
            return EXIT_STOPPED
        log(
            f"the memory guard (pid {child.pid}) {how_it_ended(returncode)} while vLLM (pid "
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
