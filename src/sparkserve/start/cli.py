"""`sparkserve start`: a launcher's one step into Python, everything a start decides.

serve.sh and mtp_serve.sh (serve_common.sh) call it once, before anything starts: it resolves
and checks every knob against this machine (ranges, the memory budget, a recipe's fit, a
pair's layout and link), reads the memory guard's record, puts the checkpoints into the cache
(sparkserve.fetch), and builds vLLM's command from the target's own config.json. It hands the
shell only what the shell runs, as records (sparkserve.launch.shell) in the file --records
names: vLLM's argv and environment, the guard's and the pair watch's commands, the watch's
state file and the line the launcher prints as it starts vLLM. The shell keeps the signals,
the children and the once-per-container refusal.

DRY_RUN=1 is the same step with the guard's record and the fetch left out: it prints the
exact command (on any machine; what this machine's memory would refuse is a note). DRY_RUN=
strict is the same step stopped before serving: every refusal a start makes here, the guard's
record looked at (a resume is not spent) and the checkpoints checked (nothing downloaded);
scripts/up.sh runs it before Compose touches the running server. Either prints the command
and hands the shell no argv: nothing starts.

A refusal is one line in the records file instead, with the start's exit status: 2 a setting,
3 the guard's record, 4 a checkpoint (the shell prints it once per container). Informational
lines (the fetch's progress, the workarounds' reasons) go to stderr as they happen.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkserve import recipes
from sparkserve.cluster.link import cluster_exports
from sparkserve.cluster.watch import state_path
from sparkserve.command_line import EXIT_BAD_INPUT, EXIT_IO, EXIT_OK, EXIT_STOPPED
from sparkserve.fetch.download import fetch_all
from sparkserve.fetch.hub import FetchError
from sparkserve.guard import record as guard_record
from sparkserve.guard.monitor import marker_path
from sparkserve.knobs.registry import LAUNCHER_SCRIPTS, LAUNCHERS, SECRETS, KnobError, Launcher
from sparkserve.launch.settings import Settings
from sparkserve.launch.shell import Value, records, shell_quote
from sparkserve.launch.start_parts import (
    checked_settings,
    guard_args,
    target_is_hybrid,
    watch_args,
)
from sparkserve.launch.versions import installed_vllm
from sparkserve.launch.vllm_command import VllmCommand, vllm_command
from sparkserve.memory.host import GIB, read_meminfo

EXIT_GUARD_RECORD = EXIT_STOPPED  # 3: the guard stopped vLLM last time
EXIT_CHECKPOINT = EXIT_IO  # 4: a checkpoint could not be fetched or checked


class Refused(Exception):
    """A start this step refuses: its exit status and its one line."""

    def __init__(self, status: int, line: str) -> None:
        super().__init__(line)
        self.status, self.line = status, line


@dataclass(frozen=True)
class Start:
    settings: Settings
    version: str  # the installed vLLM's release
    command: VllmCommand
    guard: list[str]
    watch: list[str]
    state_file: Path
    total_bytes: int


def decide(
    env: Mapping[str, str], launcher: Launcher, prog: str, pid: int, total_bytes: int
) -> Start:
    """Every check and step of a start up to serving (DRY_RUN decides how far); Refused on the
    first that refuses."""
    try:
        settings, notes = checked_settings(env, launcher, total_bytes)
        address = cluster_exports(settings.text)["CLUSTER_HOST_IP"]  # the link's knobs, checked
    except KnobError as error:
        raise Refused(EXIT_BAD_INPUT, f"{prog}: {error}") from error
    mode = settings.values.DRY_RUN
    if mode != "1":
        line = guard_record.refusal(
            marker_path(settings.values.HF_HOME), settings.values.GUARD_RESUME,
            guard_record.state_dir(env), prog, look=mode == "strict",
        )  # fmt: skip
        if line:
            raise Refused(EXIT_GUARD_RECORD, line)
        try:
            fetch_all(settings, prog, check=mode == "strict")
        except FetchError as error:
            raise Refused(EXIT_CHECKPOINT, f"{prog}: {error}") from error
    version = installed_vllm()
    shipped = recipes.geometry_of(settings.values.MODEL)
    hybrid, note = target_is_hybrid(settings, str(shipped) if shipped is not None else None)
    command = vllm_command(settings, version, hybrid, address)
    for line in [*notes, *(f"vLLM {version}: {why}" for why in command.notes), note]:
        if line:
            print(f"{prog}: {line}", file=sys.stderr)
    state_file = state_path(env)
    guard, watch = guard_args(settings, pid), watch_args(settings, pid, address, state_file)
    return Start(settings, version, command, guard, watch, state_file, total_bytes)


def quoted(words: list[str]) -> str:
    """Words as bash's ${words[*]@Q} shows them."""
    return " ".join(shell_quote(word) for word in words)


def dry_run_text(start: Start, prog: str) -> str:
    """The exact environment and commands of the start, secrets hidden."""
    launcher = start.settings.launcher
    # the fetch this step makes, as the command that makes the same one
    offline = f"HF_HUB_OFFLINE={start.settings.text['HF_OFFLINE']}"
    fetch = ["env", offline, "python3", "-m", "sparkserve", "fetch", "--launcher", launcher,
             "--prog", LAUNCHER_SCRIPTS[launcher]]  # fmt: skip
    lines = [f"{prog}: dry run (vLLM {start.version} found); nothing started"]
    lines += [f"env: {line}" for line in start.command.shown_env()]
    lines.append(f"fetch: {quoted(fetch)}")
    if start.guard:
        lines.append(f"guard: {quoted(start.guard)}")
    if start.watch:
        lines.append(f"watch: {quoted(start.watch)}")
    lines.append(f"exec: vllm serve {quoted(start.command.argv)}")
    return "".join(f"{line}\n" for line in lines)


def banner(start: Start, prog: str) -> str:
    s = start.settings.text
    return (
        f"{prog}: starting vLLM {start.version}: {s['MODEL']} on {s['HOST']}:{s['PORT']} "
        f"(GPU_MEM {s['GPU_MEM']} of {start.total_bytes / GIB:.1f} GiB, prefix cache "
        f"{s['PREFIX_CACHE']})"
    )


def shell_variables(start: Start, prog: str) -> dict[str, Value]:
    """What the launcher's shell runs; for a dry run no argv: nothing starts."""
    if start.settings.values.DRY_RUN != "0":
        return {"VLLM_ARGS": []}
    return {
        "VLLM_ARGS": start.command.argv,
        "VLLM_ENV": [f"{k}={v}" for k, v in start.command.env.items()],
        "GUARD_ARGS": start.guard,
        "WATCH_ARGS": start.watch,
        "CLUSTER_STATE_FILE": str(start.state_file),
        "BANNER": banner(start, prog),
        # the secret knobs, which the launcher unsets before vLLM starts (the pair watch,
        # started before, signs with CLUSTER_SECRET; vLLM's key travels as VLLM_ENV's own)
        "SECRET_KNOBS": sorted(SECRETS),
    }


def run_start(
    env: Mapping[str, str], launcher: Launcher, prog: str, pid: int, records_file: Path
) -> int:
    try:
        start = decide(env, launcher, prog, pid, read_meminfo().total)
    except Refused as refused:
        records_file.write_text(refused.line)
        return refused.status
    mode = start.settings.values.DRY_RUN
    if mode != "0":
        sys.stdout.write(dry_run_text(start, prog))
        sys.stdout.flush()
    if mode == "strict":
        print(f"{prog}: strict dry run: a start with these settings passes every check on "
              "this machine", file=sys.stderr)  # fmt: skip
    records_file.write_bytes(records(shell_variables(start, prog)))
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    return run_start(os.environ, args.launcher, args.prog, args.pid, args.records)


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "start", help="the launchers' own step: check, fetch and build vLLM's command"
    )
    parser.add_argument("--launcher", choices=LAUNCHERS, required=True)
    parser.add_argument("--prog", default="sparkserve", help="name to put on lines")
    parser.add_argument(
        "--pid", type=int, required=True, help="the process the guard and the pair watch watch"
    )
    parser.add_argument(
        "--records", type=Path, required=True,
        help="where the shell's variables go (NUL-separated records), or a refusal's line",
    )  # fmt: skip
    parser.set_defaults(run=_run)
