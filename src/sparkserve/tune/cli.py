"""`sparkserve tune`: find, by restarting the server with each candidate, the largest memory
setting that passes the stress bank on this machine (`memory`) and the draft length that
serves a workload fastest (`draft`); docs/TUNING.md.

The server is restarted through compose (`--driver compose`, a deployment) or through its
launcher (`--driver launcher --pid-file F`: a server serve.sh or mtp_serve.sh runs on this
host, the pid its vLLM's). It must be one of sparkserve's, and it is left running with the
value found; interrupted (Ctrl-C, SIGTERM), the tune restarts it with the starting setting
first. The knob lines go to stdout, and into a `.env` only with --write-env.

Exit status: 0 a value was found, 1 none passed (the starting setting is back), 2 bad input or
a server that is not sparkserve's (nothing restarted), 3 a restart or run broke off, 130
interrupted (the starting setting is back).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sparkserve import __version__
from sparkserve import command_line as cl
from sparkserve.client.prompts import KINDS, parse_kinds
from sparkserve.client.tool import say, write_report
from sparkserve.guard.monitor import marker_path
from sparkserve.knobs.registry import BY_NAME, KnobError
from sparkserve.launch.settings import Settings, check_budget, check_recipe_fits, resolve_settings
from sparkserve.memory import checkpoint
from sparkserve.memory.host import GIB, read_meminfo
from sparkserve.output.atomic_file import replace_text
from sparkserve.recipes import RecipeError
from sparkserve.server.driver_options import (
    add_restart_options,
    guarded,
    prepare,
)
from sparkserve.server.restarts import Restarter, estimate_line, knob_lines
from sparkserve.tune import candidates as cand
from sparkserve.tune import report, workload
from sparkserve.tune.draft_loop import run_draft_loop
from sparkserve.tune.memory_loop import run_memory_loop, trials_as_dicts

PROG = "sparkserve tune"


def _shared(parser: argparse.ArgumentParser) -> None:
    add_restart_options(parser, PROG)
    parser.add_argument(
        "--write-env",
        type=Path,
        metavar="FILE",
        help="also write the knob line found into FILE (a compose .env)",
    )
    parser.add_argument(
        "--restart-s",
        type=cl.ranged(float, "--restart-s", 0),
        default=None,
        help="the restart time to estimate with before one is measured "
        "(default: 60 s on the cpu image, 300 s on a Spark)",
    )


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tune = commands.add_parser(
        "tune",
        help="find the largest safe memory setting and the "
        "fastest draft length by restarting the server with each",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    loops = tune.add_subparsers(dest="tune_command", metavar="LOOP", required=True)
    memory = loops.add_parser(
        "memory",
        help="the largest GPU_MEM / KV_CACHE_GB that passes "
        "the stress bank with OS_RESERVE_GB intact",
    )
    _shared(memory)
    memory.add_argument(
        "--knob",
        choices=cand.MEMORY_KNOBS,
        help="the pool knob (default: KV_CACHE_GB where it is set, as on the "
        "cpu image, else GPU_MEM)",
    )
    memory.add_argument(
        "--candidates",
        help="values to try, e.g. 0.85,0.8,0.75 (default: "
        "from the plan's largest that keeps OS_RESERVE_GB, stepping down)",
    )
    memory.add_argument(
        "--count",
        type=cl.ranged(int, "--count", 1, 20),
        default=3,
        help="default candidates: how many (3)",
    )
    memory.add_argument(
        "--step",
        type=cl.ranged(float, "--step", 0.01),
        default=None,
        help="default candidates: the step down (GPU_MEM 0.03, KV_CACHE_GB 1)",
    )
    memory.add_argument(
        "--os-reserve-gb",
        type=cl.ranged(float, "--os-reserve-gb", 0),
        help="GiB MemAvailable must keep (default: the OS_RESERVE_GB knob)",
    )
    memory.add_argument("--bank", help="the stress bank's levels (default: stress's own)")
    memory.add_argument("--gen-tokens", type=cl.ranged(int, "--gen-tokens", 1), default=2048)
    memory.add_argument("--prompt-tokens", type=cl.ranged(int, "--prompt-tokens", 16))
    memory.add_argument("--settle-s", type=cl.ranged(float, "--settle-s", 0), default=3.0)
    memory.add_argument(
        "--stress-s",
        type=cl.ranged(float, "--stress-s", 0),
        default=300.0,
        help="the stress run's time to estimate with (default 300)",
    )
    memory.set_defaults(run=run_memory)
    draft = loops.add_parser(
        "draft", help="the draft length (NUM_SPEC_TOKENS) that serves a workload fastest"
    )
    _shared(draft)
    draft.add_argument(
        "--lengths", default="2,4,8", help="draft lengths to serve, 0 for none (default 2,4,8)"
    )
    draft.add_argument(
        "--kinds", default=",".join(KINDS), help=f"bench's prompt kinds (default {','.join(KINDS)})"
    )
    draft.add_argument(
        "--prompts-file", type=Path, help='your own prompts: JSONL, one {"prompt": "..."} a line'
    )
    draft.add_argument(
        "--per-kind",
        type=cl.ranged(int, "--per-kind", 1),
        default=2,
        help="prompts of each kind (default 2)",
    )
    draft.add_argument("--gen-tokens", type=cl.ranged(int, "--gen-tokens", 2), default=256)
    draft.add_argument("--api", choices=("chat", "completions"), default="chat")
    draft.add_argument(
        "--measure-s",
        type=cl.ranged(float, "--measure-s", 0),
        default=None,
        help="a length's measurement to estimate with (default: from the workload at 10 tok/s)",
    )
    draft.set_defaults(run=run_draft)


def _default_restart_s(args: argparse.Namespace, served: Settings) -> float:
    """The restart time to estimate with before one is measured."""
    if args.restart_s is not None:
        return float(args.restart_s)
    return 60.0 if served.image == "cpu" else 300.0


def _weights_bytes(settings: Settings) -> tuple[int, str]:
    try:
        directory = checkpoint.locate(settings.values.MODEL, Path(settings.values.HF_HOME))
        found = checkpoint.weights(directory)
    except checkpoint.CheckpointError:
        found = None
    if found is None:
        return 0, "weights not found on this host: the plan's check counts none"
    return found.bytes, f"weights {found.bytes / GIB:.2f} GiB ({found.source})"


def _stress(
    args: argparse.Namespace,
    env: Mapping[str, str],
    url: str,
    model: str,
    reserve: float,
    record: Path | None,
) -> Callable[[Path], int]:
    """The stress run of one candidate, on the tune's own knobs (env: the environment over
    --env-file), so it sends the API_KEY the tune reached the server with."""

    def run(folder: Path) -> int:
        from sparkserve.cli import build_parser

        argv = ["stress", "--url", url, "--model", model, "--out", str(folder),
                "--os-reserve-gb", f"{reserve:g}", "--gen-tokens", str(args.gen_tokens),
                "--settle-s", f"{args.settle_s:g}"]  # fmt: skip
        if record is not None:
            argv += ["--guard-record", str(record)]
        if args.bank:
            argv += ["--bank", args.bank]
        if args.prompt_tokens:
            argv += ["--prompt-tokens", str(args.prompt_tokens)]
        # stdout carries only the knob lines: the stress run's verdict goes to stderr
        parsed = build_parser("stress").parse_args(argv)
        with contextlib.redirect_stdout(sys.stderr):
            return int(parsed.run(parsed, env))

    return run


def write_env(path: Path, changes: Mapping[str, str]) -> None:
    """Set each knob's line in a .env (replaced where it is, appended where it is not). The
    file is replaced whole, keeping its mode (atomic_file): it holds API_KEY and HF_TOKEN, and
    a crash or a full disk must never leave it cut short."""
    lines = path.read_text().splitlines() if path.is_file() else []
    for key, value in changes.items():
        pattern = re.compile(rf"^\s*(export\s+)?{re.escape(key)}\s*=")
        hits = [i for i, line in enumerate(lines) if pattern.match(line)]
        if hits:
            lines[hits[-1]] = f"{key}={value}"
        else:
            lines.append(f"{key}={value}")
    replace_text(path, "\n".join(lines) + "\n")


def _recommend(args: argparse.Namespace, knob: str, value: str) -> int:
    """The knob line on stdout, and into the .env file only when asked (--write-env)."""
    print(knob_lines({knob: value}), end="", flush=True)
    if args.write_env is not None:
        try:
            write_env(args.write_env, {knob: value})
        except OSError as error:
            say(f"[tune] cannot write {args.write_env}: {error.strerror}; it is as it was")
            return cl.EXIT_IO
        say(f"[tune] wrote {knob}={value} into {args.write_env}")
    return cl.EXIT_OK


def _memory(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    server, info, out, driver, served = prepare(args, env, "tune-memory", "tune")
    default_restart = _default_restart_s(args, served)
    knob = args.knob or ("KV_CACHE_GB" if served.values.KV_CACHE_GB is not None else "GPU_MEM")
    start_value = served.text[knob]  # as set: what a restart puts back
    if not start_value:
        raise cl.UsageError(f"{knob} is not set on the server: tune GPU_MEM (--knob GPU_MEM)")
    reserve = args.os_reserve_gb if args.os_reserve_gb is not None else served.values.OS_RESERVE_GB
    total = read_meminfo().total
    weights, weights_note = _weights_bytes(served)
    if args.candidates:
        values = cand.parse_values(knob, args.candidates, "--candidates")
    else:
        step = args.step or {"GPU_MEM": 0.03, "KV_CACHE_GB": 1.0}[knob]
        values = cand.default_memory_values(knob, reserve, total, weights, args.count, step)
    candidates = cand.memory_candidates(knob, values, reserve, total, weights)
    if not candidates:
        raise cl.UsageError(
            f"no {knob} candidate: the plan leaves none that keeps "
            f"OS_RESERVE_GB={reserve:g} on {total / GIB:.1f} GiB"
        )
    started_at = dt.datetime.now(dt.UTC)
    say(
        f"[tune] {info.model} at {server.url}: {knob}={start_value} now; OS reserve "
        f"{reserve:g} GiB of {total / GIB:.1f} GiB; {weights_note}; candidates "
        + ", ".join(c.value + (" (refused by the plan)" if c.refused else "") for c in candidates)
    )
    startable = sum(1 for c in candidates if c.refused is None)
    say(estimate_line(startable, default_restart, args.stress_s, "a stress run"))
    restarts = Restarter(driver, {knob: start_value}, args.healthy_timeout_s, say, "tune")
    # The guard's stop record: the stress run judges it only where it is a path of this host
    # (the launcher driver); the driver reads it either way (a container's through Docker).
    record = marker_path(served.values.HF_HOME) if args.driver == "launcher" else None
    out.mkdir(parents=True, exist_ok=True)
    trials, kept = run_memory_loop(
        restarts, knob, candidates,
        _stress(args, env, server.url, info.model, reserve, record), out,
        lambda since: driver.guard_stop(served.values.HF_HOME, since), args.stress_s,
        default_restart, say,
    )  # fmt: skip
    result = {
        "tool": "sparkserve tune memory", "version": __version__,
        "started_at": started_at.isoformat(timespec="seconds"), "url": server.url,
        "model": info.model, "driver": args.driver, "knob": knob, "start_value": start_value,
        "kept": kept, "os_reserve_gib": reserve, "mem_total_gib": total / GIB,
        "weights_gib": weights / GIB, "restart_s": restarts.took_s,
        "candidates": trials_as_dicts(trials),
        "running": restarts.running(knob),
        "files": {"json": "tune-memory.json", "png": "tune-memory.png"},
    }  # fmt: skip
    write_report(out, "tune-memory", result, report.plot_memory, "tune")
    if kept is None:
        say(f"[tune] no candidate passed; the server runs with {knob}={start_value} again")
        return cl.EXIT_FAILED
    return _recommend(args, knob, kept)


def _draft_refusals(
    served: Settings, lengths: list[int], knobs: Mapping[str, str]
) -> dict[int, str]:
    total = read_meminfo().total
    refused: dict[int, str] = {}
    for length in lengths:
        try:
            settings = resolve_settings({**knobs, "NUM_SPEC_TOKENS": str(length)}, served.launcher)
            check_budget(settings, total)
            check_recipe_fits(settings, total)
        except (KnobError, RecipeError) as exc:
            refused[length] = str(exc)
    return refused


def _draft(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    lengths = cand.parse_lengths(args.lengths, int(BY_NAME["NUM_SPEC_TOKENS"].maximum or 16))
    if args.prompts_file is not None:
        prompts = workload.file_prompts(args.prompts_file)
    else:
        prompts = workload.kind_prompts(parse_kinds(args.kinds), args.per_kind)
    server, info, out, driver, served = prepare(args, env, "tune-draft", "tune")
    default_restart = _default_restart_s(args, served)
    if (
        not served.speculating
        and served.values.SPEC_METHOD == ""
        and served.launcher == "dflash"
        and not served.values.DRAFT_MODEL
    ):
        raise cl.UsageError("the server has no drafter (DRAFT_MODEL empty)")
    method = served.values.SPEC_METHOD or served.launcher
    start_value = served.text["NUM_SPEC_TOKENS"]  # as set: what a restart puts back
    refused = _draft_refusals(served, lengths, driver.knobs())
    measure_s = args.measure_s
    if measure_s is None:
        measure_s = len(prompts) * args.gen_tokens / 10.0
    started_at = dt.datetime.now(dt.UTC)
    say(
        f"[tune] {info.model} at {server.url}: {method} drafting, NUM_SPEC_TOKENS="
        f"{start_value} now; lengths {','.join(map(str, lengths))}; workload "
        f"{len(prompts)} prompt(s) x {args.gen_tokens} tokens ({args.api})"
    )
    startable = [n for n in lengths if n not in refused]
    restarts_needed = sum(1 for n in startable if str(n) != start_value)
    say(
        estimate_line(len(startable), default_restart, measure_s, "the workload")
        + f" ({restarts_needed} restart(s) at most, and one to the fastest)"
    )
    restarts = Restarter(
        driver, {"NUM_SPEC_TOKENS": start_value}, args.healthy_timeout_s, say, "tune"
    )

    def measure() -> dict[str, Any]:
        return workload.measure(server, info.model, prompts, args.gen_tokens, args.api, say)

    rows, best = run_draft_loop(
        restarts, lengths, refused, measure, measure_s, default_restart, say
    )
    result = {
        "tool": "sparkserve tune draft", "version": __version__,
        "started_at": started_at.isoformat(timespec="seconds"), "url": server.url,
        "model": info.model, "driver": args.driver, "method": method,
        "start_value": start_value, "recommended": best, "api": args.api,
        "gen_tokens": args.gen_tokens,
        "workload": [p.source for p in prompts], "restart_s": restarts.took_s,
        "lengths": rows, "running": restarts.running("NUM_SPEC_TOKENS"),
        "files": {"json": "tune-draft.json", "png": "tune-draft.png"},
    }  # fmt: skip
    write_report(out, "tune-draft", result, report.plot_draft, "tune")
    if best is None:
        say("[tune] no length was measured; the starting setting is back")
        return cl.EXIT_FAILED
    return _recommend(args, "NUM_SPEC_TOKENS", str(best))


run_memory = guarded(PROG, "tune", _memory)
run_draft = guarded(PROG, "tune", _draft)
