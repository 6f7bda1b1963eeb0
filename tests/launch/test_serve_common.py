"""serve_common.sh's run_vllm, sourced by a real bash: a stop's SIGTERM that lands as vLLM dies.

The guard and its keeper stop vLLM by SIGKILLing what is below the launcher and SIGTERMing the
launcher (sparkserve.guard.stopping). When the SIGTERM reaches bash while it reaps vLLM, bash (5.2)
can lose vLLM's status; a launcher that then waits for vLLM again blocks until its other
child, the guard's keeper, exits: the keeper waits out its grace and SIGKILLs the launcher,
and a stop promised within seconds takes the whole grace.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from sparkserve.launch.shell import Value, read_records, records
from support.promises import GUARD_RESTART_S

REPO = Path(__file__).resolve().parents[2]
# Rounds of the race (about 12 ms each). Without its fix the launcher was stuck within the
# first 8 rounds in each of 4 runs on a quiet 2-core machine; with it, in none of 6 x 160.
ROUNDS = 160
HANG_S = 60.0  # a guard against a hang, never a speed target
# vLLM's stand-in, run as `vllm serve`: it becomes `sleep`, as in tests/guard/test_guard.py.
VLLM = "#!/bin/sh\nexec sleep 300\n"
# The launcher's last steps: the keeper's stand-in beside vLLM, stops passed on, vLLM run.
LAUNCHER = """
set -euo pipefail
PROG=serve.sh
source "$1"
VLLM_ARGS=(--model stand-in)
sleep 301 </dev/null &
pass_stops_to_vllm
run_vllm
"""


def _vllm_of(shell: psutil.Process, deadline: float) -> psutil.Process:
    while time.monotonic() < deadline:
        for child in shell.children():
            with contextlib.suppress(psutil.Error):
                if child.cmdline() == ["sleep", "300"]:
                    return child
        time.sleep(0.002)
    raise AssertionError("vLLM's stand-in did not start")


def test_a_stop_that_lands_as_vllm_dies_ends_the_launcher_at_once(tmp_path: Path) -> None:
    """Each round: SIGKILL vLLM, then SIGTERM the launcher within a millisecond, as a stop does;
    the launcher must exit within the keeper's promised bound, never wait for the keeper."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(VLLM)
    (bin_dir / "vllm").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    pace = random.Random(0)
    for round_ in range(ROUNDS):
        shell = subprocess.Popen(
            ["bash", "-c", LAUNCHER, "launcher", str(REPO / "serve_common.sh")],
            env=env, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            vllm = _vllm_of(psutil.Process(shell.pid), time.monotonic() + GUARD_RESTART_S)
            vllm.send_signal(signal.SIGKILL)
            time.sleep(pace.choice([0.0, 1e-5, 5e-5, 1e-4, 3e-4, 1e-3]))
            shell.send_signal(signal.SIGTERM)
            try:
                shell.wait(timeout=GUARD_RESTART_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the launcher outlived its stop's SIGTERM in round {round_}")
            assert shell.returncode != 0  # a stopped vLLM is no success
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGKILL)  # the keeper's stand-in too
            shell.wait()


# Values no launcher variable may turn into code: substitutions, quotes, an array's syntax,
# newlines, an empty word, text that is not ASCII.
HOSTILE = [
    "$(touch {marker})", "`touch {marker}`", "'; touch {marker}; '", "(a $(touch {marker}) b)",
    "line one\nline two", "", " spaced ", "ünïcode \\ back\\slash", "-e", "*",
]  # fmt: skip
# The variables as the shell holds them after set_variables, NUL-separated: NAME, then for an
# array its length and words, for a scalar its value.
SHOW = """
set -euo pipefail
PROG=serve.sh
source "$1"
set_variables "$2"
for name in "${@:3}"; do
  if [[ "$(declare -p "${name}")" == "declare -a"* ]]; then
    declare -n words="${name}"
    printf '%s\\0%s\\0' "${name}" "${#words[@]}"
    (( ${#words[@]} == 0 )) || printf '%s\\0' "${words[@]}"
    unset -n words
  else
    printf '%s\\0%s\\0' "${name}" "${!name}"
  fi
done
"""


def _set_in_bash(
    tmp_path: Path, data: bytes, names: list[str]
) -> subprocess.CompletedProcess[bytes]:
    (tmp_path / "records").write_bytes(data)
    return subprocess.run(
        ["bash", "-c", SHOW, "show", str(REPO / "serve_common.sh"), str(tmp_path / "records"),
         *names],
        capture_output=True, timeout=HANG_S, check=False,
    )  # fmt: skip


def test_set_variables_reads_every_value_as_data(tmp_path: Path) -> None:
    """What a Python step says (sparkserve.launch.shell.records) arrives in bash word for word, and
    nothing of it runs."""
    marker = tmp_path / "ran"
    words = [value.format(marker=marker) for value in HOSTILE]
    variables: dict[str, Value] = {f"S{i}": word for i, word in enumerate(words)}
    variables |= {"ARGS": words, "EMPTY": [], "ONE": [""]}
    done = _set_in_bash(tmp_path, records(variables), list(variables))
    assert done.returncode == 0, done.stderr
    fields = done.stdout.decode().split("\0")[:-1]
    shown: dict[str, Value] = {}
    while fields:
        name, first = fields.pop(0), fields.pop(0)
        if isinstance(variables[name], str):
            shown[name] = first
        else:
            shown[name] = [fields.pop(0) for _ in range(int(first))]
    assert shown == {k: v if isinstance(v, str) else list(v) for k, v in variables.items()}
    assert read_records(records(variables)) == shown
    assert not marker.exists()


@pytest.mark.parametrize(
    "data",
    [b"scalar\0lower\0x\0", b"scalar\0A B\0x\0", b"array\0ARGS\0-1\0", b"array\0ARGS\0x\0",
     b"export\0A\0x\0", b"scalar\0A\0", b"array\0ARGS\x0003\0a\0b\0c\0",
     b"array\0ARGS\x003\0a\0"],
    ids=["lower-case", "space", "negative-count", "count-not-a-number", "unknown-kind",
         "cut-short", "count-with-a-leading-zero", "fewer-words-than-its-count"],
)  # fmt: skip
def test_set_variables_refuses_what_it_cannot_read(tmp_path: Path, data: bytes) -> None:
    done = _set_in_bash(tmp_path, data, [])
    assert done.returncode == 1
    assert done.stderr.decode().startswith("serve.sh: unreadable output of a sparkserve step")


def test_records_refuse_a_name_or_value_the_shell_cannot_hold() -> None:
    with pytest.raises(ValueError, match="not a launcher variable name"):
        records({"lower": "x"})
    with pytest.raises(ValueError, match="a NUL inside"):
        records({"ARGS": ["a\0b"]})
