"""Command line shared by every patch: apply (default), --check, --dry-run, --revert."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sparkserve.command_line import EXIT_FAILED, EXIT_IO, EXIT_OK, EXIT_STOPPED
from sparkserve.patching.engine import (
    Patch,
    PatchError,
    State,
    diff,
    read_source,
    write_atomically,
)
from sparkserve.patching.vllm_install import locate

# The shared exit codes, as this command uses them.
EXIT_NEEDED = EXIT_FAILED  # --check only: the patch would change the file
EXIT_UNRECOGNISED = EXIT_STOPPED  # code we do not know: nothing was changed


def build_parser(patch: Patch, prog: str) -> argparse.ArgumentParser:
    info = patch.info
    parser = argparse.ArgumentParser(
        prog=prog,
        description=f"{info.name}: {info.description} Affects vLLM {info.affected}; "
        f"fixed upstream in {info.fixed_in}.",
    )
    parser.add_argument(
        "--vllm-root",
        type=Path,
        help="the vllm package directory or its parent (default: the importable vllm)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="report the state; exit 1 if the patch is needed"
    )
    mode.add_argument("--dry-run", action="store_true", help="print the diff; write nothing")
    mode.add_argument("--revert", action="store_true", help="restore the original bytes")
    return parser


def run(patch: Patch, argv: list[str] | None = None, prog: str | None = None) -> int:
    prog = prog or f"sparkserve patch {patch.info.name}"
    args = build_parser(patch, prog).parse_args(argv)
    try:
        return _run(patch, args)
    except PatchError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_IO


def _run(patch: Patch, args: argparse.Namespace) -> int:
    install = locate(args.vllm_root)
    path = install.file(patch.info.target)
    former = patch.info.former_target
    if not path.is_file() and former is not None and install.file(former).is_file():
        path = install.file(former)  # an older release, before vLLM moved the function
    name = f"{patch.info.name} ({path}, vLLM {install.version})"
    if not path.is_file():
        print(
            f"unrecognised: {path}: file absent; expected vllm/{patch.info.target} "
            f"(vLLM {install.version})",
            file=sys.stderr,
        )
        return EXIT_UNRECOGNISED
    source = read_source(path)
    finding, _ = patch.classify(source)

    if finding.state is State.UNRECOGNISED:
        print(f"unrecognised: {path}: {finding.detail}; nothing changed", file=sys.stderr)
        return EXIT_UNRECOGNISED

    if args.revert:
        if finding.state is not State.APPLIED:
            print(f"not applied: {name}: nothing to revert")
            return EXIT_OK
        write_atomically(path, patch.revert_source(source))
        print(f"reverted: {name}")
        return EXIT_OK

    if finding.state is State.FIXED_UPSTREAM:
        print(f"vLLM already has the fix: {name}: {finding.detail}; nothing changed")
        return EXIT_OK
    if finding.state is State.APPLIED:
        print(f"already applied: {name}")
        return EXIT_OK

    if args.check:
        print(f"needed: {name}: {finding.detail}")
        return EXIT_NEEDED
    patched = patch.apply_source(source)
    if args.dry_run:
        sys.stdout.write(diff(Path("vllm") / patch.info.target, source, patched))
        return EXIT_OK
    write_atomically(path, patched)
    print(f"applied: {name}")
    return EXIT_OK
