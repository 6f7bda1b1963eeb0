"""`sparkserve stress`: fill a running server's KV pool at a bank of concurrency levels while
sampling host memory; PASS when swap did not grow and MemAvailable stayed above the OS reserve.
On a pair (CLUSTER_NODES=2) both hosts are judged, the worker's memory read from the head's
pair watch (CLUSTER_HEAD_ADDR:CLUSTER_WATCH_PORT) about once a second.

Exit status: 0 PASS, 1 FAIL, 2 bad input or a server not usable (checked before any load),
3 the run broke off (a request failed: the server stopped?), 130 interrupted (Ctrl-C). In the
last two cases what was measured is still written.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkserve import __version__
from sparkserve.client import metrics, tool
from sparkserve.client.bank import default_bank, parse_bank, size_phases
from sparkserve.client.server import PreflightError, ServerError
from sparkserve.client.tool import UsageError, say
from sparkserve.command_line import EXIT_FAILED, EXIT_OK, NumberOption
from sparkserve.guard.monitor import MARKER_NAME, marker_path
from sparkserve.launch.settings import tool_settings
from sparkserve.output.atomic_file import replace_text
from sparkserve.stress import pair_memory
from sparkserve.stress.run import StressRun, kv_probe
from sparkserve.stress.sampler import MemorySampler, Sample
from sparkserve.stress.verdict import GuardStop, judge

INF = math.inf
NUMBER_OPTIONS: tuple[NumberOption, ...] = (
    ("--os-reserve-gb", float, 0, INF, None,
     "GiB MemAvailable must stay above (default: the OS_RESERVE_GB knob)"),
    ("--swap-tolerance-mib", float, 0, INF, 0.0, "swap growth still counted as none (default 0)"),
    ("--gen-tokens", int, 1, INF, 2048, "tokens each request generates (default 2048)"),
    ("--prompt-tokens", int, 16, INF, None,
     "fixed prompt length (default: sized so each level fills the KV pool)"),
    ("--fill", float, 0, INF, 1.0,
     "share of the KV pool each level's requests add up to (default 1.0)"),
    ("--pool-tokens", int, 1, INF, None,
     "KV pool size in tokens when /metrics lacks vllm:cache_config_info"),
    ("--sample-hz", float, 5.0, INF, 10.0, "memory samples per second, 5 or more (default 10)"),
    ("--settle-s", float, 0, INF, 3.0, "idle seconds before, between and after phases (default 3)"),
    ("--progress-s", float, 0.1, INF, 5.0, "seconds between progress lines (default 5)"),
)  # fmt: skip


def own_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server-log", type=Path,
        help="a vLLM log to read the pool size from ('GPU KV cache size: N tokens')",
    )  # fmt: skip
    parser.add_argument(
        "--guard-record", type=Path,
        help="the memory guard's stop record, to name a guard stop in the verdict "
        f"(default: $HF_HOME/{MARKER_NAME} where HF_HOME is set, as in the container)",
    )  # fmt: skip


def guard_stop(given: Path | None, env: Mapping[str, str], t0_epoch: float) -> GuardStop | None:
    """The guard's record when it stopped vLLM after this run began, placed on its clock."""
    path = given or (marker_path(env["HF_HOME"]) if env.get("HF_HOME") else None)
    try:
        record = json.loads(path.read_text()) if path is not None else {}
        at = float(record["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return GuardStop(at - t0_epoch, str(record.get("reason", ""))) if at >= t0_epoch else None


def _pool_from_log(path: Path) -> int:
    try:
        pool = metrics.pool_tokens_from_log(path.read_text(errors="replace"))
    except OSError as exc:
        raise UsageError(f"bad --server-log {str(path)!r}: {exc.strerror}") from None
    if pool is None:
        raise UsageError(f"bad --server-log {str(path)!r}: no 'GPU KV cache size' line in it")
    return pool


def _run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    # Everything is checked before any load.
    settings = tool_settings(env)
    reserve = args.os_reserve_gb
    if reserve is None:
        reserve = settings.values.OS_RESERVE_GB
    seqs = tool.max_num_seqs(args, settings)
    bank = parse_bank(args.bank) if args.bank is not None else default_bank(seqs)
    pool = args.pool_tokens
    if pool is None and args.server_log is not None:
        pool = _pool_from_log(args.server_log)
    server, info = tool.connect(args, settings, pool)
    phases = size_phases(
        bank,
        pool_tokens=info.pool_tokens,
        max_model_len=info.max_model_len,
        gen_tokens=args.gen_tokens,
        prompt_tokens=args.prompt_tokens,
        fill=args.fill,
    )
    out = tool.output_folder(args.out, "stress")
    sampler = MemorySampler(args.sample_hz, kv_probe=kv_probe(server, info.model))
    pair, pair_note = pair_memory.watch_for(env, sampler.now)
    stress = StressRun(
        server, info.model, phases, sampler,
        settle_s=args.settle_s, progress_s=args.progress_s, say=say,
    )  # fmt: skip
    try:
        stress.prepare()
    except ServerError as exc:
        raise PreflightError(f"server not usable: {exc}") from None
    out.mkdir(parents=True, exist_ok=True)

    say(
        f"[stress] {server.url} model {info.model}: max_model_len {info.max_model_len}, KV pool "
        f"{info.pool_tokens} tokens ({info.pool_source}); bank {','.join(map(str, bank))}; OS "
        f"reserve {reserve:g} GiB; sampling at {args.sample_hz:g} Hz; writing to {out}/"
    )
    if pair_note:
        say(f"[stress] {pair_note}")
    started = dt.datetime.now(dt.UTC)
    sampler.start()
    if pair is not None:
        pair.start()
    t0_epoch = time.time() - sampler.now()
    try:
        outcome = tool.run_cut_short(stress.run, on_interrupt=stress.stop)
        if outcome.status == "done":
            time.sleep(min(args.settle_s, 1.0))
    finally:
        samples = sampler.stop()
        if pair is not None:
            pair.stop()

    stopped = guard_stop(args.guard_record, env, t0_epoch)
    verdict = judge(samples, reserve, args.swap_tolerance_mib / 1024, stopped)
    pair_report = pair.report(reserve, args.swap_tolerance_mib / 1024) if pair else None
    if pair_report is not None:
        verdict = pair_memory.with_pair(verdict, pair_report)
    if stopped is not None and outcome.status == "aborted":
        outcome.status = "done"  # the requests failed because the guard stopped vLLM: a verdict
    duration = samples[-1].t - samples[0].t if len(samples) > 1 else 0.0
    phase_dicts = [r.as_dict(samples, sampler.t0) for r in stress.records if r.start_t is not None]
    result: dict[str, Any] = {
        "tool": COMMAND.prog,
        "version": __version__,
        "started_at": started.isoformat(timespec="seconds"),
        "t0_epoch": t0_epoch,
        "status": outcome.label(verdict.as_dict()["result"]),
        "error": outcome.error,
        "url": server.url,
        "model": info.model,
        "max_model_len": info.max_model_len,
        "pool_tokens": info.pool_tokens,
        "pool_source": info.pool_source,
        "bank": bank,
        "os_reserve_gib": reserve,
        "swap_tolerance_mib": args.swap_tolerance_mib,
        "host": {
            "mem_total_gib": sampler.total_gib,
            "swap_total_gib": sampler.swap_total_gib,
            "gpu": sampler.gpu_note or "nvidia-smi",
        },
        "sampling": {
            "requested_hz": args.sample_hz,
            "samples": len(samples),
            "duration_s": duration,
            "achieved_hz": (len(samples) - 1) / duration if duration > 0 else None,
        },
        "phases": phase_dicts,
        "verdict": verdict.as_dict(),
        "files": {"json": "stress.json", "csv": "stress.csv", "png": "stress.png"},
    }
    if pair_report is not None or pair_note:
        result["pair"] = pair_report or {"error": pair_note}
    write_outputs(out, result, samples, verdict.worst_t, reserve)
    prefix = "" if outcome.status == "done" else "partial run: "
    table = "" if pair_report is None else pair_memory.table(pair_report) + "\n"
    tool.report(out, result, outcome, f"{table}{prefix}{verdict.line}\n")
    return outcome.exit_code(EXIT_OK if verdict.passed else EXIT_FAILED)


def write_outputs(
    out: Path, result: dict[str, Any], samples: list[Sample], worst_t: float | None, reserve: float
) -> None:
    fields = list(Sample.__dataclass_fields__)
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=fields)
    writer.writeheader()
    for sample in samples:
        writer.writerow(sample.row())
    replace_text(out / "stress.csv", table.getvalue())

    def draw() -> None:
        from sparkserve.stress.plot import plot

        title = (
            f"sparkserve stress: {result['model']} at {result['url']}, bank "
            f"{','.join(map(str, result['bank']))} - {result['verdict']['result']}"
            + ("" if result["status"] in ("PASS", "FAIL") else f" ({result['status']})")
        )
        label = "worst moment" if result["verdict"]["result"] == "FAIL" else "lowest MemAvailable"
        plot(samples, result["phases"], reserve, worst_t, title, out / "stress.png", label)

    tool.write_result(out, result, draw)


COMMAND = tool.LoadCommand(
    "stress", "fill the server's KV pool at several concurrencies while watching host memory",
    ("--bank", "concurrency levels, e.g. 1,2,4 (default: 1,2,3,MAX_NUM_SEQS+1)"),
    NUMBER_OPTIONS, own_options, _run,
)  # fmt: skip
add_command = COMMAND.add_command
