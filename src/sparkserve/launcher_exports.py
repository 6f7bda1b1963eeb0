"""What a launcher learns before it builds vLLM's command line, as shell exports.

`sparkserve knobs resolve --launcher L` takes the chosen RECIPE's values for the knobs the user
did not set (sparkserve.recipes), validates every knob, checks the memory budget against
this machine, finds the installed vLLM's release and the workarounds it needs, and prints
`export NAME='value'` lines for the launcher to eval. On any problem it prints one line
naming the knob, the value and what is allowed, and exits 2 (the launcher then stops).

Besides the knobs it exports VLLM_FOUND_VERSION, MEM_TOTAL_GIB, GUARD_MARKER (the guard's
record of a stop), CLUSTER_HOST_IP and CLUSTER_DIST_TIMEOUT_S (a pair's link, checked by
sparkserve.cluster.link; empty on one node), CLUSTER_STATE_FILE (the pair watch's state),
and what the workarounds that apply add: WORKAROUND_ARGV (a bash array of `vllm serve` arguments),
WORKAROUND_SPECULATIVE_FIELDS (`,"key":value` text for the speculative config's JSON) and
WORKAROUND_NOTES (a bash array: each one's reason, for the launcher to print).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from sparkserve import recipes
from sparkserve.cluster.layout import check_layout
from sparkserve.cluster.link import cluster_exports
from sparkserve.cluster.watch import state_path
from sparkserve.command_line import EXIT_BAD_INPUT, EXIT_OK, fail
from sparkserve.guard import marker_path, metrics_dir
from sparkserve.knobs import KnobError, Launcher, knobs_for, resolve
from sparkserve.memory.budget import budget_problem
from sparkserve.memory.host import GIB, read_meminfo
from sparkserve.patching.engine import PatchError
from sparkserve.patching.vllm_install import locate
from sparkserve.workarounds import WORKAROUNDS


def shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def bash_array(name: str, words: list[str] | tuple[str, ...]) -> str:
    return f"{name}=({' '.join(shell_quote(word) for word in words)})"


def exports(env: Mapping[str, str], launcher: Launcher, total_bytes: int) -> list[str]:
    values = resolve(recipes.apply(env, launcher, total_bytes), launcher)
    problem = budget_problem(values["GPU_MEM"], values["OS_RESERVE_GB"], total_bytes)
    if problem is not None:
        raise KnobError(problem)
    try:
        vllm_version = locate(None).version
    except PatchError:
        vllm_version = "unknown"
    derived = {
        "VLLM_FOUND_VERSION": vllm_version,
        "MEM_TOTAL_GIB": f"{total_bytes / GIB:.1f}",
        "KV_CACHE_BYTES": str(int(float(values["KV_CACHE_GB"]) * GIB))
        if values["KV_CACHE_GB"]
        else "",
        "GUARD_MARKER": str(marker_path(values["HF_HOME"])),
        "GUARD_METRICS_DIR": str(metrics_dir(values["HF_HOME"])),
    }
    check_layout(values, launcher)
    derived |= cluster_exports(values)
    derived["CLUSTER_STATE_FILE"] = str(state_path(env))
    argv: list[str] = []
    notes: list[str] = []
    speculative = ""
    for workaround in WORKAROUNDS:
        applies = workaround.applies(
            vllm_version,
            launcher,
            prefix_cache=values["PREFIX_CACHE"] == "1",
            speculating=int(values["NUM_SPEC_TOKENS"]) > 0,
        )
        if applies:
            notes.append(workaround.reason)
            argv += workaround.vllm_args
            speculative += workaround.speculative_json()
    derived["WORKAROUND_SPECULATIVE_FIELDS"] = speculative
    secret = {knob.name for knob in knobs_for(launcher) if knob.secret}
    lines = [f"export {k}={shell_quote(v)}" for k, v in values.items() if k not in secret]
    lines += [f"export {k}={shell_quote(v)}" for k, v in derived.items()]
    lines.append(bash_array("WORKAROUND_ARGV", argv))
    lines.append(bash_array("WORKAROUND_NOTES", notes))
    # EXTRA_ARGS as a bash array, split here once so the launcher never re-parses it
    lines.append(bash_array("EXTRA_ARGV", shlex.split(values.get("EXTRA_ARGS", ""))))
    return lines


def main_resolve(launcher: Launcher, env: Mapping[str, str], prog: str) -> int:
    try:
        total = read_meminfo().total
        lines = exports(env, launcher, total)
    except KnobError as error:
        return fail(prog, error, EXIT_BAD_INPUT)
    print("\n".join(lines))
    return EXIT_OK
