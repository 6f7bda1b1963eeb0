"""The `sparkserve` command: one entry point for the project's tools."""

from __future__ import annotations

import argparse
import sys

from sparkserve import __version__
from sparkserve.patching import ALL_PATCHES
from sparkserve.patching.cli import run as run_patch


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="sparkserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"sparkserve {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    patch = commands.add_parser(
        "patch", help="apply, check or revert a build-time vLLM patch", add_help=False
    )
    patch.add_argument("name", choices=sorted(ALL_PATCHES), help="the patch")
    if not argv:
        parser.print_help()
        return 2
    # Patch options belong to the patch's own parser, so split before argparse sees them.
    if argv[0] == "patch" and len(argv) > 1 and argv[1] in ALL_PATCHES:
        return run_patch(ALL_PATCHES[argv[1]], argv[2:], prog=f"sparkserve patch {argv[1]}")
    parser.parse_args(argv)
    return 2


if __name__ == "__main__":
    sys.exit(main())
