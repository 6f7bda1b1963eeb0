"""`sparkserve fetch`: put the checkpoints a launcher will serve into the model cache first.

Runs before vLLM starts (the launchers' first step, and compose's *-fetch services), so a slow
download never counts against the server's healthcheck and vLLM itself can run offline. Uses
huggingface_hub's `snapshot_download` and HF_TOKEN. Before downloading it asks the Hub for the
revision's file list and sizes, removes partial files a stopped fetch left, and refuses when
the cache's disk cannot hold what is missing. Files finished by an earlier run are kept; a
file cut short is fetched again from its start (huggingface_hub 2.x does not resume inside a
file). Progress: huggingface_hub's bars on a terminal, else a line per finished file and at
least every 10 s (fetch.download.PROGRESS_EVERY_S) (what `docker compose logs` shows).

A checkpoint fetched completely once is recorded in the cache; later runs find it there and
make no network call. Every run checks that the snapshot is whole before vLLM starts (every
file its weights index lists is there, each safetensors file at the length its own header
gives, sparkserve.fetch.cache.incomplete): what is not is fetched again (online), or refused in
one line naming the file (HF_OFFLINE=1, or a Hub that cannot be reached). HF_OFFLINE=1 never
contacts the Hub. A MODEL that is a local folder is used as it is, once it is whole.

`--check` makes every refusal a fetch would make and changes nothing (sparkserve.fetch.check).

Exit status: 0 every checkpoint is in the cache and whole (with --check: would be); 2 a bad
knob; 4 a checkpoint could not be fetched or checked (the Hub's answer, a full disk, a file
missing or cut short). Each failure is one line on stderr naming the knob, the repo and what to
do.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from sparkserve.fetch.download import fetch_all
from sparkserve.fetch.hub import (
    FetchError,
)
from sparkserve.knobs.registry import LAUNCHERS, KnobError, Launcher
from sparkserve.launch.settings import resolve_settings

EXIT_BAD_KNOB = 2
EXIT_FETCH_FAILED = 4


def run_fetch(env: Mapping[str, str], launcher: Launcher, prog: str, check: bool = False) -> int:
    """`sparkserve fetch`: the checkpoints of `launcher`'s settings from `env` (compose's
    *-fetch services); a failure is one line on stderr."""
    try:
        settings = resolve_settings(env, launcher)
    except KnobError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_BAD_KNOB
    try:
        fetch_all(settings, prog, check)
    except FetchError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_FETCH_FAILED
    return 0


def _run(args: argparse.Namespace) -> int:
    return run_fetch(os.environ, args.launcher, args.prog, check=args.check)


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "fetch", help="download the checkpoints a launcher will serve into the model cache"
    )
    parser.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="dflash",
        help="whose checkpoints: dflash (target and drafter) or mtp (target)",
    )
    parser.add_argument("--prog", default="sparkserve fetch", help="name to put on log lines")
    parser.add_argument(
        "--check",
        action="store_true",
        help="download nothing: make every refusal a fetch would make (the strict dry run's)",
    )
    parser.set_defaults(run=_run)
