"""What every `sparkserve` sub-command shares: exit codes, one-line errors, ranged numbers.

Standard library only: the memory guard imports this and must start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from sparkserve.knobs.registry import bound_text

# One meaning per exit code, for every sub-command.
EXIT_OK = 0
EXIT_FAILED = 1  # the check's answer is no: does not fit, FAIL, a blocker, a patch needed
EXIT_BAD_INPUT = 2  # a bad option or knob, or a server not usable; nothing was done
EXIT_STOPPED = 3  # stopped short: a run broke off, a figure could not be computed, the guard
# stopped vLLM, a patch target was not recognised; what was done is reported
EXIT_IO = 4  # a file could not be read or written; nothing was changed
EXIT_NOT_TESTED = 5  # nothing failed, but something the settings claim was not tested (selftest,
# verify: the int8 head did not run, no draft was proposed, random weights cannot judge)
EXIT_INTERRUPTED = 130  # Ctrl-C; what was measured is still written


class UsageError(ValueError):
    """Bad input; the message is one line naming the value and what is allowed."""


def fail(prog: str, message: object, status: int = EXIT_BAD_INPUT) -> int:
    """Print `prog: message` on stderr (one line) and return `status`."""
    print(f"{prog}: {message}", file=sys.stderr)
    return status


def one_line_errors(parser: argparse.ArgumentParser, prog: str) -> None:
    """Make argparse report a bad option in one line (no usage block), exit EXIT_BAD_INPUT.

    argparse prefixes "argument --x: "; it is dropped when the message names the option."""

    def error(message: str) -> NoReturn:
        head, sep, rest = message.partition(": ")
        if head.startswith("argument ") and sep and head[len("argument ") :] in rest:
            message = rest
        print(f"{prog}: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)

    parser.error = error  # type: ignore[method-assign]


def number_rule(kind: type[float] | type[int], low: float, high: float = math.inf) -> str:
    noun = "a whole number" if kind is int else "a number"
    if math.isinf(high):
        return f"{noun} of at least {bound_text(low)}"
    return f"{noun} from {bound_text(low)} to {bound_text(high)}"


def ranged(
    kind: type[float] | type[int], option: str, low: float, high: float = math.inf
) -> Callable[[str], float]:
    """An argparse `type` taking a finite `kind` number from `low` to `high`; its error names
    the option, the value and the rule: `--x='5': must be a number from 0 to 1`."""

    def parse(text: str) -> float:
        try:
            value: float = kind(text)
        except ValueError:
            value = math.nan
        # an int is always finite (and may be too large for isfinite's float)
        if not ((kind is int or math.isfinite(value)) and low <= value <= high):
            raise argparse.ArgumentTypeError(
                f"{option}={text!r}: must be {number_rule(kind, low, high)}"
            )
        return value

    return parse


# An option taking a ranged number: (option, kind, low, high, default, help).
NumberOption = tuple[str, type[float] | type[int], float, float, float | None, str]


def add_numbers(parser: argparse.ArgumentParser, options: tuple[NumberOption, ...]) -> None:
    for option, kind, low, high, default, help_text in options:
        parser.add_argument(
            option, type=ranged(kind, option, low, high), default=default, help=help_text
        )


def standalone(
    prog: str,
    doc: str,
    configure: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
    argv: list[str] | None = None,
) -> int:
    """A tool's own `main` for `python -m sparkserve.TOOL` (fast: no other sub-command is
    imported): its parser from `configure`, described by the first line of `doc`."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    configure(parser)
    return run(parser.parse_args(argv))


def sigterm_when_parent_dies(parent: int) -> bool:
    """Ask the kernel to SIGTERM this process when its parent, `parent`, dies
    (PR_SET_PDEATHSIG). False when `parent` is not (or no longer) our parent."""
    if os.getppid() != parent:
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    return os.getppid() == parent  # it may have died between the check and the prctl
