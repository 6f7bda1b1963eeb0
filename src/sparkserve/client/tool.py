"""What the commands that load a running server (`stress`, `bench`) share: the server options,
the checks before any load, the run that Ctrl-C or a failed request may cut short, the exit
status and the output folder. Each command keeps only its own options, work and report."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkserve import command_line as cl
from sparkserve.client.server import PreflightError, Server, ServerInfo
from sparkserve.command_line import UsageError
from sparkserve.knobs.registry import KnobError
from sparkserve.launch.dotenv import DotenvError, with_dotenv
from sparkserve.launch.settings import Settings
from sparkserve.output.atomic_file import replace_text


class RunAborted(RuntimeError):
    """A request failed during the run (the server stopped, or refused the load)."""


# Errors found before any load: the command prints one line and exits EXIT_BAD_INPUT.
BEFORE_LOAD_ERRORS = (UsageError, KnobError, PreflightError, DotenvError)


@dataclass(frozen=True)
class LoadCommand:
    """A command that loads a running server: its name and help, its concurrency levels option
    (name, help), its number options, a function adding its other own options, and its body
    (the parsed arguments and the knobs' environment -> the exit status), whose module's
    docstring is the command's description. The options every such command has, the one-line
    errors and the environment come from here."""

    name: str
    help: str
    levels: tuple[str, str]
    numbers: tuple[cl.NumberOption, ...]
    own_options: Callable[[argparse.ArgumentParser], None]
    body: Callable[[argparse.Namespace, Mapping[str, str]], int]

    @property
    def prog(self) -> str:
        return f"sparkserve {self.name}"

    @property
    def description(self) -> str | None:
        return sys.modules[self.body.__module__].__doc__

    def add_command(self, commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        parser = commands.add_parser(
            self.name,
            help=self.help,
            description=self.description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        cl.one_line_errors(parser, self.prog)
        parser.add_argument(
            "--url", help="the server (default: http://127.0.0.1:$PORT, PORT from the knobs)"
        )
        parser.add_argument(
            "--model",
            help="served model name (default: $SERVED_MODEL_NAME if set, else the only one served)",
        )
        parser.add_argument("--out", type=Path, help="output folder (default: a new dated one)")
        parser.add_argument(
            "--env-file", type=Path,
            help="a compose .env to read knobs from (PORT, API_KEY, ...); the environment wins",
        )  # fmt: skip
        parser.add_argument(
            "--request-timeout", type=cl.ranged(float, "--request-timeout", 0.1), default=900.0,
            metavar="S", help="seconds a request may wait for its next bytes (default 900)",
        )  # fmt: skip
        parser.add_argument(
            "--max-num-seqs", type=cl.ranged(int, "--max-num-seqs", 1),
            help="the server's MAX_NUM_SEQS for the default levels (default: the knob)",
        )  # fmt: skip
        parser.add_argument(self.levels[0], help=self.levels[1])
        cl.add_numbers(parser, self.numbers)
        self.own_options(parser)
        parser.set_defaults(run=self.run)

    def run(self, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
        """The body on `env` (default: the process's) over --env-file's variables; an error
        found before any load is one line and EXIT_BAD_INPUT."""
        try:
            return self.body(args, with_dotenv(os.environ if env is None else env, args.env_file))
        except BEFORE_LOAD_ERRORS as exc:
            return cl.fail(self.prog, exc, cl.EXIT_BAD_INPUT)


def max_num_seqs(args: argparse.Namespace, settings: Settings) -> int:
    return int(args.max_num_seqs or settings.values.MAX_NUM_SEQS)


def connect(
    args: argparse.Namespace, settings: Settings, pool_tokens: int | None = None
) -> tuple[Server, ServerInfo]:
    """The server of --url (else the PORT knob) with the API_KEY knob, checked: it answers and
    serves the model of --model (else $SERVED_MODEL_NAME if set, else its only one).
    `settings`: the tool's (launch.settings.tool_settings), resolved once per run."""
    url = args.url or f"http://127.0.0.1:{settings.values.PORT}"
    server = Server(url, settings.values.API_KEY, args.request_timeout)
    model = args.model
    if not model and settings.layer["SERVED_MODEL_NAME"] in ("user", "recipe"):
        model = settings.values.SERVED_MODEL_NAME
    return server, server.probe(model or None, pool_tokens)


def output_folder(given: Path | None, stem: str) -> Path:
    """--out, else `stem-YYYYmmdd-HHMMSS`; refused when it is a file. Not created here."""
    out = given if given is not None else Path(f"{stem}-{dt.datetime.now():%Y%m%d-%H%M%S}")
    if out.exists() and not out.is_dir():
        raise UsageError(f"bad --out {str(out)!r}: exists and is not a folder")
    return out


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def write_report(
    out: Path,
    stem: str,
    document: dict[str, Any],
    draw: Callable[[dict[str, Any], Path], None],
    tag: str,
) -> None:
    """OUT/STEM.png drawn from `document`, then OUT/STEM.json; without matplotlib the JSON
    says `files.png: null` and a line says why."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        draw(document, out / f"{stem}.png")
    except ImportError as exc:
        document["files"]["png"] = None
        say(f"[{tag}] no plot: {exc} (install matplotlib)")
    replace_text(out / f"{stem}.json", json.dumps(document, indent=2, default=str) + "\n")
    say(f"[{tag}] wrote {out}/" + ", ".join(f for f in document["files"].values() if f))


@dataclass
class Outcome:
    status: str = "done"  # "done", "aborted" (a request failed) or "interrupted" (Ctrl-C)
    error: str | None = None

    def label(self, done: str) -> str:
        """The status word of the report: `done` when it ran to the end."""
        return {"done": done, "aborted": "ERROR"}.get(self.status, "INTERRUPTED")

    def exit_code(self, done: int) -> int:
        return {"done": done, "aborted": cl.EXIT_STOPPED}.get(self.status, cl.EXIT_INTERRUPTED)


def run_cut_short(
    work: Callable[[], Any], on_interrupt: Callable[[], None] | None = None
) -> Outcome:
    """Run `work` with Ctrl-C raising KeyboardInterrupt; a failed request (RunAborted) or
    Ctrl-C ends it early and the outcome says which, so that what was measured is still
    written."""
    outcome = Outcome()
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        work()
    except RunAborted as exc:
        outcome = Outcome("aborted", str(exc))
    except KeyboardInterrupt:
        outcome = Outcome("interrupted", "interrupted (SIGINT): partial results")
        if on_interrupt is not None:
            on_interrupt()
    finally:
        signal.signal(signal.SIGINT, previous)
    return outcome


def report(out: Path, result: dict[str, Any], outcome: Outcome, text: str) -> None:
    """After the run: `text` (the table or verdict) on stdout; what cut the run short, if
    anything, and the files written on stderr."""
    stem = result["tool"].split()[-1]
    if outcome.error:
        say(f"[{stem}] {outcome.error}")
    print(text, end="", flush=True)
    say(f"[{stem}] wrote {out}/" + ", ".join(f for f in result["files"].values() if f))


def write_result(out: Path, result: dict[str, Any], draw: Callable[[], None]) -> None:
    """The plot (`draw`), then `<tool>.json`; without matplotlib the run is noted and the json
    names no png."""
    stem = result["tool"].split()[-1]
    try:
        draw()
    except ImportError as exc:
        result["files"]["png"] = None
        say(f"[{stem}] no plot: {exc} (install matplotlib)")
    replace_text(out / f"{stem}.json", json.dumps(result, indent=2) + "\n")
