"""What a launcher learns from Python, in two steps, as shell variables (sparkserve.launch.shell's
records, which the launcher reads as data: nothing here is run as shell code).

`sparkserve knobs resolve --launcher L --pid PID` (before anything starts) decides the start:
it resolves the settings (sparkserve.launch.settings), checks the memory budget, a chosen
recipe's fit, the pair's layout and link against this machine, and sets what the shell's own
steps read: every knob's value (secrets excepted), VLLM_FOUND_VERSION, MEM_TOTAL_GIB,
GUARD_MARKER (the guard's record of a stop), CLUSTER_STATE_FILE (the pair watch's state),
CLUSTER_HOST_IP (this node's address on the pair's link; empty on one node), the commands of the
fetch, of the memory guard and of the pair watch that watch PID (FETCH_ARGS, GUARD_ARGS,
WATCH_ARGS; the last two empty when they do not run), and LAUNCH_PLAN (sparkserve.launch.
launch_plan: what it decided, for the second step).

`sparkserve knobs command` (after the fetch, so the target's config.json is in the cache) reads
LAUNCH_PLAN on its standard input and nothing else the first step decided: it sets vLLM's
command and environment (sparkserve.launch.vllm_command) as bash arrays VLLM_ARGS, VLLM_ENV
(NAME=value, for `export`) and VLLM_ENV_SHOWN (NAME='value' lines with secrets hidden, for a dry
run), and NOTES (lines for the launcher to print: the workarounds' reasons, what a dry run's
machine would refuse).

On any problem either prints one line naming the knob, the value and what is allowed, and
exits 2 (the launcher then stops).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from sparkserve.cluster.link import cluster_exports
from sparkserve.cluster.watch import state_path
from sparkserve.command_line import EXIT_BAD_INPUT, EXIT_OK, fail
from sparkserve.guard.monitor import marker_path, metrics_dir
from sparkserve.knobs.registry import LAUNCHER_SCRIPTS, SECRETS, KnobError, Launcher
from sparkserve.launch.cluster_layout import check_layout
from sparkserve.launch.launch_plan import LaunchPlan
from sparkserve.launch.settings import Settings, check_budget, check_recipe_fits, resolve_settings
from sparkserve.launch.shell import Value, records
from sparkserve.launch.versions import installed_vllm
from sparkserve.launch.vllm_command import vllm_command
from sparkserve.memory.checkpoint import CheckpointError, is_hybrid, locate, read_config
from sparkserve.memory.host import GIB, read_meminfo


def checked_settings(
    env: Mapping[str, str], launcher: Launcher, total_bytes: int
) -> tuple[Settings, list[str]]:
    """The settings, with every check that can refuse a start before anything runs. A dry run
    (DRY_RUN=1) shows the command on any machine: what this machine's memory would refuse
    comes back as notes instead; the strict one (DRY_RUN=strict) refuses as a start does."""
    settings = resolve_settings(env, launcher)
    check_layout(settings)
    notes: list[str] = []
    for check in (check_budget, check_recipe_fits):
        try:
            check(settings, total_bytes)
        except KnobError as error:
            if settings.values.DRY_RUN != "1":
                raise
            notes.append(f"this machine would refuse it: {error}")
    return settings, notes


def target_is_hybrid(settings: Settings, shipped_geometry: str | None = None) -> tuple[bool, str]:
    """(hybrid, note) from the target's config.json: in the cache (the fetch put it there),
    a local folder, or, for a dry run before the fetch, a shipped recipe's copy of it."""
    try:
        config = read_config(locate(settings["MODEL"], Path(settings["HF_HOME"])))
    except CheckpointError as error:
        if shipped_geometry is None:
            return False, f"MODEL's config.json is not at hand ({error}): taken as not hybrid"
        config = read_config(Path(shipped_geometry))
    return is_hybrid(config), ""


def resolve_exports(
    env: Mapping[str, str], launcher: Launcher, total_bytes: int, pid: int
) -> dict[str, Value]:
    settings, notes = checked_settings(env, launcher, total_bytes)
    address = cluster_exports(settings.text)["CLUSTER_HOST_IP"]  # the link's knobs, checked
    version = installed_vllm()
    state_file = state_path(env)
    variables: dict[str, Value] = {
        name: value for name, value in settings.text.items() if name not in SECRETS
    }
    variables |= {
        "VLLM_FOUND_VERSION": version,
        "MEM_TOTAL_GIB": f"{total_bytes / GIB:.1f}",
        "GUARD_MARKER": str(marker_path(settings["HF_HOME"])),
        "CLUSTER_STATE_FILE": str(state_file),
        "CLUSTER_HOST_IP": address,
        "FETCH_ARGS": [
            "env", f"HF_HUB_OFFLINE={settings['HF_OFFLINE']}", "python3", "-m", "sparkserve",
            "fetch", "--launcher", launcher, "--prog", LAUNCHER_SCRIPTS[launcher],
            "--plan-on-stdin",
        ],
        "GUARD_ARGS": guard_args(settings, pid),
        "WATCH_ARGS": watch_args(settings, pid, address, state_file),
        "LAUNCH_PLAN": LaunchPlan.of(settings, total_bytes, version, address, notes).to_json(),
    }  # fmt: skip
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


def command_exports(plan_json: str) -> dict[str, Value]:
    plan = LaunchPlan.from_json(plan_json)
    settings = plan.settings()
    hybrid, note = target_is_hybrid(settings, plan.shipped_geometry)
    command = vllm_command(settings, plan.vllm_version, hybrid, plan.host_ip)
    notes = [*plan.notes, *(f"vLLM {plan.vllm_version}: {why}" for why in command.notes)]
    return {
        "VLLM_ARGS": command.argv,
        "VLLM_ENV": [f"{k}={v}" for k, v in command.env.items()],
        "VLLM_ENV_SHOWN": command.shown_env(),
        "NOTES": [*notes, *([note] if note else [])],
    }


def main_resolve(launcher: Launcher, env: Mapping[str, str], prog: str, pid: int) -> int:
    return _print_or_fail(prog, lambda: resolve_exports(env, launcher, read_meminfo().total, pid))


def main_command(plan_json: str, prog: str) -> int:
    return _print_or_fail(prog, lambda: command_exports(plan_json))


def _print_or_fail(prog: str, make: Callable[[], dict[str, Value]]) -> int:
    try:
        variables = make()
    except KnobError as error:
        return fail(prog, error, EXIT_BAD_INPUT)
    sys.stdout.buffer.write(records(variables))
    sys.stdout.flush()
    return EXIT_OK
