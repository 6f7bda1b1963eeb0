"""The `sparkserve` command: one entry point for the project's tools.

Each tool lives in its own module with an `add_command(subparsers)` that registers its
sub-command and sets `run` (a function taking the parsed arguments, returning the exit code).
Only the module of the sub-command typed is imported: the launchers run `sparkserve knobs`
on every start (and the suite hundreds of times), and importing every tool for it cost more
than the step itself. `--help`, no command or an unknown one gets the whole parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from sparkserve import __version__
from sparkserve.patching import ALL_PATCHES, TRIAL_PATCHES

REPO = Path(__file__).resolve().parents[2]

# The sub-commands that live in a module of their own (see the module docstring), each with
# its module; tests/cli/test_command_line.py checks each module registers exactly its name.
COMMAND_MODULES: dict[str, str] = {
    "stress": "sparkserve.stress.cli",
    "bench": "sparkserve.bench.cli",
    "llama-benchy": "sparkserve.bench.benchy.cli",
    "plan": "sparkserve.plan.cli",
    "guard": "sparkserve.guard.monitor",
    "doctor": "sparkserve.doctor.cli",
    "fetch": "sparkserve.fetch.cli",
    "start": "sparkserve.start.cli",
    "recipes": "sparkserve.plan.recipes_cli",
    "dashboard": "sparkserve.monitoring.dashboard",
    "cluster": "sparkserve.cluster.cli",
    "tune": "sparkserve.tune.cli",
    "selftest": "sparkserve.selftest.run",
    "verify": "sparkserve.verify.cli",
    "router": "sparkserve.router.cli",
}


def _run_patch(args: argparse.Namespace) -> int:
    from sparkserve.patching.cli import run

    patch = (ALL_PATCHES | TRIAL_PATCHES)[args.name]
    return run(patch, args.options, prog=f"sparkserve patch {args.name}")


def _run_knobs(args: argparse.Namespace) -> int:
    from sparkserve.knobs.docs import sync

    return _report_drift(sync(args.repo, check=args.check), args.check)


def _run_docs(args: argparse.Namespace) -> int:
    from sparkserve.docsync import data_tables

    return _report_drift(data_tables.sync(args.repo, check=args.check), args.check)


# The sub-commands this module registers itself (they import their module when they run).
BUILT_IN = ("patch", "knobs", "docs")


def _report_drift(drifted: list[str], check: bool) -> int:
    for name in drifted:
        print(f"{'out of date' if check else 'updated'}: {name}")
    return 1 if drifted and check else 0


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with `only` (a sub-command's name) the built-in sub-commands
    (which import their module when they run) and only `only`'s module's."""
    parser = argparse.ArgumentParser(prog="sparkserve", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"sparkserve {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    patch = commands.add_parser("patch", help="apply, check or revert a build-time vLLM patch")
    patch.add_argument("name", choices=sorted(ALL_PATCHES | TRIAL_PATCHES))
    patch.add_argument("options", nargs=argparse.REMAINDER, help="the patch's own options")
    patch.set_defaults(run=_run_patch)

    knobs = commands.add_parser("knobs", help="the launchers' settings")
    knobs.set_defaults(run=_run_knobs)
    knob_commands = knobs.add_subparsers(dest="knobs_command", metavar="ACTION", required=True)
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

    for name, module in COMMAND_MODULES.items():
        if only in (None, name):
            importlib.import_module(module).add_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    typed = argv[0] if argv else None
    parser = build_parser(typed if typed in COMMAND_MODULES or typed in BUILT_IN else None)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
