"""What a launcher learns from Python, in two steps, as shell variables (sparkserve.launch.shell's
records, which the launcher reads as data: nothing here is run as shell code).

`sparkserve knobs resolve --launcher L` (before anything starts): resolves the settings
(sparkserve.launch.settings), checks the memory budget, a chosen recipe's fit, the pair's layout and
link against this machine, and sets what the shell's own steps read: every knob's value
(secrets excepted), VLLM_FOUND_VERSION, MEM_TOTAL_GIB, GUARD_MARKER (the guard's record of a
stop), CLUSTER_STATE_FILE (the pair watch's state), CLUSTER_HOST_IP (this node's address on
the pair's link; empty on one node) and FETCH_ARGS (the fetch's command).

`sparkserve knobs command --launcher L --pid PID` (after the fetch, so the target's config.json
is in the cache): exports vLLM's command and environment (sparkserve.launch.vllm_command) as bash
arrays VLLM_ARGS, VLLM_ENV (NAME=value, for `export`) and VLLM_ENV_SHOWN (NAME='value' lines
with secrets hidden, for a dry run), NOTES (lines for the launcher to print: the workarounds'
reasons, what a dry run's machine would refuse), and the commands of the memory guard
and the pair watch that watch PID (GUARD_ARGS, WATCH_ARGS; empty when they do not run).

On any problem either prints one line naming the knob, the value and what is allowed, and
exits 2 (the launcher then stops).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from sparkserve import recipes
from sparkserve.cluster.link import cluster_exports
from sparkserve.cluster.watch import state_path
from sparkserve.command_line import EXIT_BAD_INPUT, EXIT_OK, fail
from sparkserve.guard.monitor import marker_path, metrics_dir
from sparkserve.knobs.registry import KnobError, Launcher
from sparkserve.launch.cluster_layout import check_layout
from sparkserve.launch.settings import Settings, check_budget, check_recipe_fits, resolve_settings
from sparkserve.launch.shell import Value, records
from sparkserve.launch.vllm_command import vllm_command
from sparkserve.memory.checkpoint import CheckpointError, is_hybrid, locate, read_config
from sparkserve.memory.host import GIB, read_meminfo
from sparkserve.patching.engine import PatchError
from sparkserve.patching.vllm_install import locate as locate_vllm

LAUNCHER_SCRIPTS = recipes.LAUNCHER_SCRIPTS


def installed_vllm() -> str:
    try:
        return locate_vllm(None).version
    except PatchError:
        return "unknown"


def checked_settings(
    env: Mapping[str, str], launcher: Launcher, total_bytes: int
) -> tuple[Settings, list[str]]:
    """The settings, with every check that can refuse a start before anything runs. A dry run
    shows the command on any machine: what this machine's memory would refuse comes back as
    notes instead."""
    settings = resolve_settings(env, launcher)
    check_layout(settings)
    notes: list[str] = []
    for check in (check_budget, check_recipe_fits):
        try:
            check(settings, total_bytes)
        except KnobError as error:
            if not settings.values.DRY_RUN:
                raise
            notes.append(f"this machine would refuse it: {error}")
    return settings, notes


def target_is_hybrid(settings: Settings) -> tuple[bool, str]:
    """(hybrid, note) from the target's config.json: in the cache (the fetch put it there),
    a local folder, or, for a dry run before the fetch, a shipped recipe's copy of it."""
    try:
        config = read_config(locate(settings["MODEL"], Path(settings["HF_HOME"])))
    except CheckpointError as error:
        shipped = recipes.geometry_of(settings["MODEL"])
        if shipped is None:
            return False, f"MODEL's config.json is not at hand ({error}): taken as not hybrid"
        config = read_config(shipped)
    return is_hybrid(config), ""


def resolve_exports(
    env: Mapping[str, str], launcher: Launcher, total_bytes: int
) -> dict[str, Value]:
    settings, _ = checked_settings(env, launcher, total_bytes)
    link = cluster_exports(settings.text)  # a pair's link knobs against this machine's
    # Shell variables, not exports: the command step resolves the same environment again, and
    # an exported default would read there as set by the user.
    variables: dict[str, Value] = {
        name: value for name, value in settings.text.items() if name not in ("API_KEY", "HF_TOKEN")
    }
    variables |= {
        "VLLM_FOUND_VERSION": installed_vllm(),
        "MEM_TOTAL_GIB": f"{total_bytes / GIB:.1f}",
        "GUARD_MARKER": str(marker_path(settings["HF_HOME"])),
        "CLUSTER_STATE_FILE": str(state_path(env)),
        **link,
    }
    variables["FETCH_ARGS"] = [
        "env", f"HF_HUB_OFFLINE={settings['HF_OFFLINE']}", "python3", "-m", "sparkserve",
        "fetch", "--launcher", launcher, "--prog", LAUNCHER_SCRIPTS[launcher],
    ]  # fmt: skip
    return variables


def guard_args(settings: Settings, pid: int) -> list[str]:
    """The guard's options, given to its keeper, which runs the guard and replaces it if it
    dies while vLLM runs (guard/keeper.py)."""
    if not settings.values.GUARD:
        return []
    return [
        "python3", "-m", "sparkserve.guard.keeper", "--pid", str(pid),
        "--floor-gb", settings["GUARD_FLOOR_GB"], "--os-reserve-gb", settings["OS_RESERVE_GB"],
        "--swap-mb-s", settings["GUARD_SWAP_MB_S"], "--psi-full-pct", settings["GUARD_PSI_PCT"],
        "--textfile-dir", str(metrics_dir(settings["HF_HOME"])),
        "--marker", str(marker_path(settings["HF_HOME"])),
    ]  # fmt: skip


def watch_args(settings: Settings, pid: int, address: str, state_file: Path) -> list[str]:
    """The pair watch: like the guard it watches PID (the launcher, whose child vLLM is) and
    stops vLLM when either node of the pair fails; on the head it also asks vLLM's API."""
    if not settings.pair:
        return []
    api = ""
    if settings.values.CLUSTER_RANK == 0:
        local = "127.0.0.1" if settings["HOST"] == "0.0.0.0" else settings["HOST"]
        api = f"http://{local}:{settings['PORT']}"
    return [
        "python3", "-m", "sparkserve.cluster.watch", "--pid", str(pid),
        "--rank", settings["CLUSTER_RANK"], "--head-addr", settings["CLUSTER_HEAD_ADDR"],
        "--host-ip", address, "--port", settings["CLUSTER_WATCH_PORT"],
        "--peer-timeout-s", settings["CLUSTER_PEER_TIMEOUT_S"],
        "--join-timeout-s", settings["CLUSTER_JOIN_TIMEOUT_S"], "--state-file", str(state_file),
        "--api-url", api,
    ]  # fmt: skip


def command_exports(
    env: Mapping[str, str], launcher: Launcher, total_bytes: int, pid: int
) -> dict[str, Value]:
    settings, notes = checked_settings(env, launcher, total_bytes)
    address = cluster_exports(settings.text)["CLUSTER_HOST_IP"]
    hybrid, note = target_is_hybrid(settings)
    version = installed_vllm()
    command = vllm_command(settings, version, hybrid, address)
    notes += [f"vLLM {version}: {reason}" for reason in command.notes]
    return {
        "VLLM_ARGS": command.argv,
        "VLLM_ENV": [f"{k}={v}" for k, v in command.env.items()],
        "VLLM_ENV_SHOWN": command.shown_env(),
        "NOTES": [*notes, *([note] if note else [])],
        "GUARD_ARGS": guard_args(settings, pid),
        "WATCH_ARGS": watch_args(settings, pid, address, state_path(env)),
    }


def main_resolve(launcher: Launcher, env: Mapping[str, str], prog: str) -> int:
    return _print_or_fail(prog, lambda total: resolve_exports(env, launcher, total))


def main_command(launcher: Launcher, env: Mapping[str, str], prog: str, pid: int) -> int:
    return _print_or_fail(prog, lambda total: command_exports(env, launcher, total, pid))


def _print_or_fail(prog: str, make: Callable[[int], dict[str, Value]]) -> int:
    try:
        variables = make(read_meminfo().total)
    except KnobError as error:
        return fail(prog, error, EXIT_BAD_INPUT)
    sys.stdout.buffer.write(records(variables))
    sys.stdout.flush()
    return EXIT_OK
