"""The helpers every `sparkserve` sub-command shares, through real argparse parsers: one-line
errors, ranged number options, the exit codes, a tool's standalone main and the parent-death
signal."""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkserve import command_line
from sparkserve.command_line import (
    EXIT_BAD_INPUT,
    EXIT_IO,
    EXIT_STOPPED,
    UsageError,
    add_numbers,
    fail,
    number_rule,
    one_line_errors,
    ranged,
    sigterm_when_parent_dies,
    standalone,
)

REPO = Path(__file__).resolve().parents[2]
PROG = "sparkserve tool"


def make_parser() -> argparse.ArgumentParser:
    # argparse's own prog differs, so the errors show which one is printed
    parser = argparse.ArgumentParser(prog="python -m tool")
    one_line_errors(parser, PROG)
    return parser


def parse_error(
    parser: argparse.ArgumentParser, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> str:
    """The error `argv` gets: exit EXIT_BAD_INPUT, one line on stderr, nothing on stdout."""
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(argv)
    assert stopped.value.code == EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err.rstrip("\n")


def test_exit_codes_each_have_one_meaning() -> None:
    codes = [value for name, value in vars(command_line).items() if name.startswith("EXIT_")]
    assert len(codes) == 7 and len(set(codes)) == len(codes)
    assert command_line.EXIT_OK == 0
    assert command_line.EXIT_INTERRUPTED == 128 + signal.SIGINT  # what a shell reports


def test_fail_prints_one_line_and_returns_the_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert fail(PROG, UsageError("--x='y': must be a number")) == EXIT_BAD_INPUT
    assert fail(PROG, "cannot write /out", EXIT_IO) == EXIT_IO
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"{PROG}: --x='y': must be a number\n{PROG}: cannot write /out\n"


def test_usage_error_is_a_value_error() -> None:
    # callers that catch ValueError from a parse also catch it
    with pytest.raises(ValueError, match="bad"):
        raise UsageError("bad")


@pytest.mark.parametrize(
    ("kind", "low", "high", "rule"),
    [
        (int, 1, math.inf, "a whole number of at least 1"),
        (float, 0, math.inf, "a number of at least 0"),
        (float, 0.1, 0.95, "a number from 0.1 to 0.95"),
        (float, 0, 100000, "a number from 0 to 100000"),
        (int, -3, 3, "a whole number from -3 to 3"),
        (int, 1, 2**50, "a whole number from 1 to 1125899906842624"),  # in full, not 1.1259e+15
        (float, 1, 4096, "a number from 1 to 4096"),
    ],
)
def test_number_rule(kind: type[float] | type[int], low: float, high: float, rule: str) -> None:
    assert number_rule(kind, low, high) == rule


@pytest.mark.parametrize(
    ("kind", "low", "high", "text", "value"),
    [
        (float, 0, 1, "0", 0.0),  # both bounds are allowed
        (float, 0, 1, "1", 1.0),
        (float, 0, 1, "0.25", 0.25),
        (float, 0, 1, "1e-1", 0.1),
        (float, 0.5, math.inf, "1e300", 1e300),
        (int, 1, math.inf, "1", 1),
        (int, 1, math.inf, "123456789012", 123456789012),
        pytest.param(int, 1, math.inf, "1" + "0" * 400, 10**400, id="larger-than-any-float"),
        (int, -3, 3, "-3", -3),
    ],
)
def test_ranged_takes_numbers_in_range(
    kind: type[float] | type[int], low: float, high: float, text: str, value: float
) -> None:
    parser = make_parser()
    parser.add_argument("--x", type=ranged(kind, "--x", low, high))
    got = parser.parse_args(["--x", text]).x
    assert got == value and type(got) is kind


@pytest.mark.parametrize(
    ("kind", "low", "high", "text", "rule"),
    [
        (float, 0, 1, "1.01", "a number from 0 to 1"),
        (float, 0, 1, "-0.01", "a number from 0 to 1"),
        (float, 0, 1, "abc", "a number from 0 to 1"),
        (float, 0, 1, "", "a number from 0 to 1"),
        (float, 0, math.inf, "nan", "a number of at least 0"),  # only finite numbers
        (float, 0, math.inf, "inf", "a number of at least 0"),
        (float, 0, math.inf, "1e999", "a number of at least 0"),
        (int, 1, math.inf, "0", "a whole number of at least 1"),
        (int, 1, math.inf, "1.5", "a whole number of at least 1"),
        (int, 1, math.inf, "1e3", "a whole number of at least 1"),
        (int, -3, 3, "4", "a whole number from -3 to 3"),
        (int, 1, 2**50, str(2**50 + 1), "a whole number from 1 to 1125899906842624"),
    ],
)
def test_ranged_refuses_in_one_line_naming_option_value_and_rule(
    kind: type[float] | type[int],
    low: float,
    high: float,
    text: str,
    rule: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = make_parser()
    parser.add_argument("--x", type=ranged(kind, "--x", low, high))
    # argparse's "argument --x: " is dropped: the message names the option itself
    assert parse_error(parser, [f"--x={text}"], capsys) == f"{PROG}: --x={text!r}: must be {rule}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--need", "1", "--nope"], "unrecognized arguments: --nope"),
        ([], "the following arguments are required: --need"),
        # argparse's own messages do not name the option: its prefix stays
        (["--need", "x"], "argument --need: invalid int value: 'x'"),
        (["--need", "1", "--mode"], "argument --mode: expected one argument"),
    ],
)
def test_other_argparse_errors_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = make_parser()
    parser.add_argument("--need", type=int, required=True)
    parser.add_argument("--mode", choices=("a", "b"))
    assert parse_error(parser, argv, capsys) == f"{PROG}: {message}"


def test_add_numbers_adds_ranged_options_with_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = make_parser()
    add_numbers(
        parser,
        (
            ("--share", float, 0, 0.9, 0.5, "the share"),
            ("--rounds", int, 2, math.inf, None, "how many rounds"),
        ),
    )
    assert vars(parser.parse_args([])) == {"share": 0.5, "rounds": None}
    assert vars(parser.parse_args(["--share", "0.9", "--rounds", "2"])) == {
        "share": 0.9,
        "rounds": 2,
    }
    assert parse_error(parser, ["--rounds", "1"], capsys) == (
        f"{PROG}: --rounds='1': must be a whole number of at least 2"
    )
    assert parse_error(parser, ["--share", "0.95"], capsys) == (
        f"{PROG}: --share='0.95': must be a number from 0 to 0.9"
    )
    help_text = parser.format_help()
    assert "the share" in help_text and "how many rounds" in help_text


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=ranged(int, "--n", 1), default=1)


def test_standalone_runs_with_the_parsed_options_and_returns_the_code() -> None:
    seen: list[argparse.Namespace] = []

    def run(args: argparse.Namespace) -> int:
        seen.append(args)
        return EXIT_STOPPED

    assert standalone(PROG, "A tool.", configure, run, ["--n", "3"]) == EXIT_STOPPED
    assert [args.n for args in seen] == [3]
    assert standalone(PROG, "A tool.", configure, run, []) == EXIT_STOPPED
    assert seen[-1].n == 1


def test_standalone_describes_the_tool_by_the_first_line_of_its_doc(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        standalone(PROG, "Watch the thing.\n\nLong details.", configure, lambda _: 0, ["--help"])
    assert stopped.value.code == 0
    help_text = capsys.readouterr().out
    assert help_text.startswith(f"usage: {PROG} ")
    assert "Watch the thing." in help_text and "Long details." not in help_text


def test_no_parent_death_signal_for_a_process_that_is_not_the_parent() -> None:
    assert sigterm_when_parent_dies(os.getpid()) is False


# A child that asks for the parent-death signal, says what it got, and marks a SIGTERM.
CHILD = """
import os, signal, sys, time
from pathlib import Path
from sparkserve.command_line import sigterm_when_parent_dies
mark = Path(sys.argv[1])
partial = mark.with_name(mark.name + ".partial")
# Written whole, then renamed: the test polls for the mark and must never read it half-written.
signal.signal(
    signal.SIGTERM,
    lambda *_: (partial.write_text("SIGTERM"), partial.replace(mark), os._exit(0)),
)
print(sigterm_when_parent_dies(os.getppid()), flush=True)
time.sleep(30)
"""
# Its parent starts it, passes on its first line, and exits without waiting for it.
PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
print(child.stdout.readline(), end="", flush=True)
"""


def test_the_child_gets_sigterm_when_its_parent_dies(tmp_path: Path) -> None:
    mark = tmp_path / "child-got"
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    done = subprocess.run(
        [sys.executable, "-c", PARENT, CHILD, str(mark)],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout == "True\n", done.stdout + done.stderr
    deadline = time.monotonic() + 60  # a guard against a hang: the signal comes at once
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mark.exists(), "the child got no SIGTERM within 60 s of its parent's exit"
    assert mark.read_text() == "SIGTERM"
