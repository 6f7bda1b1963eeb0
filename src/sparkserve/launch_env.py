"""What a launcher learns before it builds vLLM's command line.

`sparkserve knobs resolve --launcher L` takes the chosen RECIPE's values for the knobs the user
did not set (sparkserve.recipes), validates every knob, checks the memory budget against
this machine, finds the installed vLLM's release and the workarounds it needs, and prints
`export NAME='value'` lines for the launcher to eval. On any problem it prints one line
naming the knob, the value and what is allowed, and exits 2 (the launcher then stops).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping

from sparkserve import recipes
from sparkserve.knobs import KnobError, Launcher, knobs_for, resolve
from sparkserve.memory.host import GIB, read_meminfo
from sparkserve.patching.engine import PatchError
from sparkserve.patching.vllm_install import locate
from sparkserve.workarounds import WORKAROUNDS

EXIT_BAD_KNOB = 2


def mem_total_bytes() -> int:
    try:
        return read_meminfo().total
    except (OSError, ValueError) as error:
        raise KnobError(f"{error}; cannot check GPU_MEM against this machine") from error


def check_memory_budget(values: Mapping[str, str], total_bytes: int) -> None:
    """Refuse a GPU_MEM that leaves the OS less than OS_RESERVE_GB of unified memory."""
    gpu_mem, reserve_gib = float(values["GPU_MEM"]), float(values["OS_RESERVE_GB"])
    total_gib = total_bytes / GIB
    left_gib = (1 - gpu_mem) * total_gib
    if left_gib < reserve_gib:
        largest = max(0.0, 1 - reserve_gib / total_gib)
        raise KnobError(
            f"GPU_MEM={values['GPU_MEM']}: {gpu_mem:.2f} of {total_gib:.1f} GiB leaves "
            f"{left_gib:.1f} GiB to the OS, less than OS_RESERVE_GB={values['OS_RESERVE_GB']}; "
            f"the largest GPU_MEM that keeps it is {int(largest * 100) / 100:.2f}"
        )


def shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def exports(env: Mapping[str, str], launcher: Launcher, total_bytes: int) -> list[str]:
    values = resolve(recipes.apply(env, launcher, total_bytes), launcher)
    check_memory_budget(values, total_bytes)
    try:
        vllm_version = locate(None).version
    except PatchError:
        vllm_version = "unknown"
    derived = {
        "VLLM_FOUND_VERSION": vllm_version,
        "MEM_TOTAL_GIB": f"{total_bytes / GIB:.1f}",
    }
    for workaround in WORKAROUNDS:
        applies = workaround.applies(vllm_version, launcher, values["PREFIX_CACHE"] == "1")
        derived[workaround.env] = "1" if applies else "0"
        derived[f"{workaround.env}_REASON"] = workaround.reason
    secret = {knob.name for knob in knobs_for(launcher) if knob.secret}
    lines = [f"export {k}={shell_quote(v)}" for k, v in values.items() if k not in secret]
    lines += [f"export {k}={shell_quote(v)}" for k, v in derived.items()]
    # EXTRA_ARGS as a bash array, split here once so the launcher never re-parses it
    words = " ".join(shell_quote(word) for word in shlex.split(values.get("EXTRA_ARGS", "")))
    lines.append(f"EXTRA_ARGV=({words})")
    return lines


def main_resolve(launcher: Launcher, env: Mapping[str, str], prog: str) -> int:
    try:
        lines = exports(env, launcher, mem_total_bytes())
    except KnobError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_BAD_KNOB
    print("\n".join(lines))
    return 0
