"""The pieces of a launcher's start that sparkserve.launch.start puts together: the settings with
every check that can refuse a start before anything runs, whether the target is hybrid, and the
commands of the memory guard and the pair watch that run beside vLLM."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sparkserve.guard.monitor import marker_path, metrics_dir
from sparkserve.knobs.registry import KnobError, Launcher
from sparkserve.launch.cluster_layout import check_layout
from sparkserve.launch.settings import (
    Settings,
    check_budget,
    check_host_bind,
    check_recipe_fits,
    resolve_settings,
)
from sparkserve.memory.checkpoint import CheckpointError, is_hybrid, locate, read_config


def checked_settings(
    env: Mapping[str, str], launcher: Launcher, total_bytes: int
) -> tuple[Settings, list[str]]:
    """The settings, with every check that can refuse a start before anything runs. A dry run
    (DRY_RUN=1) shows the command on any machine: what this machine's memory would refuse
    comes back as notes instead; the strict one (DRY_RUN=strict) refuses as a start does."""
    settings = resolve_settings(env, launcher)
    check_host_bind(settings, env)
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
        config = read_config(locate(settings.values.MODEL, Path(settings.values.HF_HOME)))
    except CheckpointError as error:
        if shipped_geometry is None:
            return False, f"MODEL's config.json is not at hand ({error}): taken as not hybrid"
        config = read_config(Path(shipped_geometry))
    return is_hybrid(config), ""


def guard_args(settings: Settings, pid: int) -> list[str]:
    """The guard's options, given to its keeper, which runs the guard and replaces it if it
    dies while vLLM runs (guard/keeper.py)."""
    if not settings.values.GUARD:
        return []
    text = settings.text  # an argv: the knobs' text, as checked
    return [
        "python3", "-m", "sparkserve.guard.keeper", "--pid", str(pid),
        "--floor-gb", text["GUARD_FLOOR_GB"], "--os-reserve-gb", text["OS_RESERVE_GB"],
        "--swap-mb-s", text["GUARD_SWAP_MB_S"], "--psi-full-pct", text["GUARD_PSI_PCT"],
        "--textfile-dir", str(metrics_dir(settings.values.HF_HOME)),
        "--marker", str(marker_path(settings.values.HF_HOME)),
    ]  # fmt: skip


def watch_args(settings: Settings, pid: int, address: str, state_file: Path) -> list[str]:
    """The pair watch: like the guard it watches PID (the launcher, whose child vLLM is) and
    stops vLLM when either node of the pair fails; on the head it also asks vLLM's API."""
    if not settings.pair:
        return []
    api = ""
    if settings.values.CLUSTER_RANK == 0:
        local = "127.0.0.1" if settings.values.HOST == "0.0.0.0" else settings.values.HOST
        api = f"http://{local}:{settings.values.PORT}"
    text = settings.text  # an argv: the knobs' text, as checked
    return [
        "python3", "-m", "sparkserve.cluster.watch", "--pid", str(pid),
        "--rank", text["CLUSTER_RANK"], "--head-addr", text["CLUSTER_HEAD_ADDR"],
        "--host-ip", address, "--port", text["CLUSTER_WATCH_PORT"],
        "--peer-timeout-s", text["CLUSTER_PEER_TIMEOUT_S"],
        "--join-timeout-s", text["CLUSTER_JOIN_TIMEOUT_S"], "--state-file", str(state_file),
        "--api-url", api,
    ]  # fmt: skip
