"""The `sparkserve` command: one entry point for the project's tools.

Each tool lives in its own module with an `add_command(subparsers)` that registers its
sub-command and sets `run` (a function taking the parsed arguments, returning the exit code).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from sparkserve import __version__, data_tables
from sparkserve.knob_docs import sync
from sparkserve.knobs import LAUNCHERS
from sparkserve.launcher_exports import main_command, main_resolve
from sparkserve.patching import ALL_PATCHES
from sparkserve.patching.cli import run as run_patch

REPO = Path(__file__).resolve().parents[2]

# Modules that add their own sub-command (see the module docstring).
COMMAND_MODULES: tuple[str, ...] = (
    "sparkserve.stress.cli",
    "sparkserve.bench.cli",
    "sparkserve.plan_cli",
    "sparkserve.guard",
    "sparkserve.doctor",
    "sparkserve.fetch",
    "sparkserve.recipes_cli",
    "sparkserve.dashboard",
    "sparkserve.cluster.cli",
    "sparkserve.tune.cli",
)


def _run_patch(args: argparse.Namespace) -> int:
    return run_patch(ALL_PATCHES[args.name], args.options, prog=f"sparkserve patch {args.name}")


def _run_knobs(args: argparse.Namespace) -> int:
    if args.knobs_command == "resolve":
        return main_resolve(args.launcher, os.environ, args.prog)
    if args.knobs_command == "command":
        return main_command(args.launcher, os.environ, args.prog, args.pid)
    return _report_drift(sync(args.repo, check=args.check), args.check)


def _run_docs(args: argparse.Namespace) -> int:
    return _report_drift(data_tables.sync(args.repo, check=args.check), args.check)


def _report_drift(drifted: list[str], check: bool) -> int:
    for name in drifted:
        print(f"{'out of date' if check else 'updated'}: {name}")
    return 1 if drifted and check else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkserve", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"sparkserve {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    patch = commands.add_parser("patch", help="apply, check or revert a build-time vLLM patch")
    patch.add_argument("name", choices=sorted(ALL_PATCHES))
    patch.add_argument("options", nargs=argparse.REMAINDER, help="the patch's own options")
    patch.set_defaults(run=_run_patch)

    knobs = commands.add_parser("knobs", help="the launchers' settings")
    knobs.set_defaults(run=_run_knobs)
    knob_commands = knobs.add_subparsers(dest="knobs_command", metavar="ACTION", required=True)
    resolve = knob_commands.add_parser(
        "resolve", help="validate the environment's knobs; print shell exports for a launcher"
    )
    resolve.add_argument("--launcher", choices=LAUNCHERS, required=True)
    resolve.add_argument("--prog", default="sparkserve", help="name to put on error lines")
    command = knob_commands.add_parser(
        "command", help="vLLM's command and environment for a launcher, as shell exports"
    )
    command.add_argument("--launcher", choices=LAUNCHERS, required=True)
    command.add_argument("--prog", default="sparkserve", help="name to put on error lines")
    command.add_argument(
        "--pid", type=int, required=True, help="the process the guard and the pair watch watch"
    )
    knob_sync = knob_commands.add_parser(
        "sync", help="regenerate the knob tables in compose, .env.example and the docs"
    )
    knob_sync.add_argument("--check", action="store_true", help="only report drift (exit 1)")
    knob_sync.add_argument("--repo", type=Path, default=REPO, help="the checkout to update")

    docs = commands.add_parser("docs", help="the docs' generated figures")
    docs.set_defaults(run=_run_docs)
    doc_commands = docs.add_subparsers(dest="docs_command", metavar="ACTION", required=True)
    docs_sync = doc_commands.add_parser(
        "sync", help="regenerate the tables and ranges docs/ quotes from docs/data"
    )
    docs_sync.add_argument("--check", action="store_true", help="only report drift (exit 1)")
    docs_sync.add_argument("--repo", type=Path, default=REPO, help="the checkout to update")

    for name in COMMAND_MODULES:
        importlib.import_module(name).add_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
