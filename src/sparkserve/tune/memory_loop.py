"""`sparkserve tune memory`'s loop: each candidate, largest first, served and put under the
stress bank (sparkserve stress); the first that passes, with MemAvailable above OS_RESERVE_GB
and no swap growth, is kept and the server is left running with it. A candidate that fails
is never left running: the next candidate replaces it, and when none passes the starting
setting comes back."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparkserve.command_line import EXIT_INTERRUPTED
from sparkserve.server.driver import RestartFailed
from sparkserve.server.restarts import Interrupted, Restarter, progress_line
from sparkserve.tune.candidates import Candidate


@dataclass
class Trial:
    value: str
    verdict: str  # PASS, FAIL, REFUSED (by the plan, never started), NO-START
    line: str
    restart_s: float | None = None
    pool_tokens: int | None = None
    min_available_gib: float | None = None
    swap_growth_gib: float | None = None
    stress_dir: str | None = None


def _trial_from_stress(value: str, took: float, out: Path, code: int) -> Trial:
    try:
        result: dict[str, Any] = json.loads((out / "stress.json").read_text())
    except (OSError, ValueError):
        return Trial(value, "FAIL", f"the stress run wrote no report (exit {code})", took)
    verdict = result["verdict"]
    passed = code == 0 and verdict["result"] == "PASS"
    line = verdict["line"] if result.get("error") is None else f"{result['error']}"
    return Trial(
        value, "PASS" if passed else "FAIL", line, took, result.get("pool_tokens"),
        verdict.get("min_available_gib"), verdict.get("swap_growth_gib"), out.name,
    )  # fmt: skip


def run_memory_loop(
    restarts: Restarter,
    knob: str,
    candidates: Sequence[Candidate],
    stress: Callable[[Path], int],
    out: Path,
    guard_stop: Callable[[float], str | None],
    measure_s: float,
    default_restart_s: float,
    say: Callable[[str], None],
) -> tuple[list[Trial], str | None]:
    """The trials and the value kept (None: none passed, the starting setting is back).
    Interrupted after the starting setting is back."""
    trials: list[Trial] = []
    started = time.monotonic()
    kept: str | None = None
    try:
        for index, candidate in enumerate(candidates, 1):
            label = f"[tune] {index}/{len(candidates)} {knob}={candidate.value}"
            if candidate.refused is not None:
                say(f"{label}: not started: {candidate.refused}")
                trials.append(Trial(candidate.value, "REFUSED", candidate.refused))
                continue
            since = time.time()
            try:
                took = restarts.serve(
                    {knob: candidate.value}, f"candidate {index} of {len(candidates)}"
                )
            except RestartFailed as exc:
                stopped = guard_stop(since)
                line = str(exc) if stopped is None else f"the memory guard stopped it: {stopped}"
                say(f"{label}: {line}")
                trials.append(Trial(candidate.value, "NO-START", line))
                estimate = restarts.restart_estimate_s(default_restart_s)
                say(progress_line(index, len(candidates), started, estimate, measure_s))
                continue
            folder = out / f"stress-{knob}-{candidate.value}"
            code = stress(folder)
            if code == EXIT_INTERRUPTED:
                raise Interrupted("SIGINT")
            trial = _trial_from_stress(candidate.value, took, folder, code)
            stopped = guard_stop(since)
            if stopped is not None:
                trial.verdict, trial.line = "FAIL", f"the memory guard stopped vLLM: {stopped}"
            trials.append(trial)
            shown = (
                trial.line
                if trial.line.startswith(trial.verdict)
                else f"{trial.verdict}: {trial.line}"
            )
            say(f"{label}: {shown}")
            estimate = restarts.restart_estimate_s(default_restart_s)
            say(progress_line(index, len(candidates), started, estimate, measure_s))
            if trial.verdict == "PASS":
                kept = candidate.value
                break
    except BaseException:
        restarts.restore()
        raise
    if kept is None:
        restarts.restore()
    return trials, kept


def trials_as_dicts(trials: Sequence[Trial]) -> list[dict[str, Any]]:
    return [asdict(t) for t in trials]
