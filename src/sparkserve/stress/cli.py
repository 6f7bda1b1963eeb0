"""`sparkserve stress`: fill a running server's KV pool at a bank of concurrency levels while
sampling host memory; PASS when swap did not grow and MemAvailable stayed above the OS reserve.

Exit status: 0 PASS, 1 FAIL, 2 bad input or a server not usable (checked before any load),
3 the run broke off (a request failed: the server stopped?), 130 interrupted (Ctrl-C). In the
last two cases what was measured is still written.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from sparkserve import __version__
from sparkserve.guard import MARKER_NAME
from sparkserve.knobs import BY_NAME, KnobError
from sparkserve.stress import metrics
from sparkserve.stress.plan import PlanError, default_bank, parse_bank, size_phases
from sparkserve.stress.run import RunAborted, StressRun, kv_probe
from sparkserve.stress.sampler import MemorySampler, Sample
from sparkserve.stress.server import PreflightError, Server, ServerError
from sparkserve.stress.verdict import GuardStop, judge

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_ABORTED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class UsageError(ValueError):
    """Bad input; one line."""


def knob_value(name: str, env: Mapping[str, str]) -> str:
    """A registry knob from the environment (unset or empty: its default), validated."""
    knob = BY_NAME[name]
    raw = env.get(name, "").strip() or knob.default
    return knob.check(raw)


def default_url(env: Mapping[str, str]) -> str:
    return f"http://127.0.0.1:{knob_value('PORT', env)}"


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """Options the stress and bench commands share."""
    parser.add_argument(
        "--url", help="the server (default: http://127.0.0.1:$PORT, PORT from the knobs)"
    )
    parser.add_argument(
        "--model",
        help="served model name (default: $SERVED_MODEL_NAME if set, else the only one served)",
    )
    parser.add_argument("--out", type=Path, help="output folder (default: a new dated one)")
    parser.add_argument(
        "--request-timeout", type=float, default=900.0, metavar="S",
        help="seconds a request may wait for its next bytes (default 900)",
    )  # fmt: skip


def one_line_errors(parser: argparse.ArgumentParser, prog: str) -> None:
    """Bad options end in one line naming the value and the rule (no usage dump)."""

    def error(message: str) -> NoReturn:
        if message.startswith("argument ") and ": bad " in message:
            message = message[message.index(": bad ") + 2 :]
        print(f"{prog}: {message} (--help lists the options)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)

    parser.error = error  # type: ignore[method-assign]


def positive(kind: type[float] | type[int], name: str, low: float = 0.0) -> Any:
    def check(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value != value or value < low:  # NaN fails value != value
            raise argparse.ArgumentTypeError(f"bad {name} {text!r}: must be a number >= {low:g}")
        return value

    return check


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "stress",
        help="fill the server's KV pool at several concurrencies while watching host memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    one_line_errors(parser, "sparkserve stress")
    add_server_options(parser)
    parser.add_argument(
        "--bank", help="concurrency levels, e.g. 1,2,4 (default: 1,2,3,MAX_NUM_SEQS+1)"
    )
    parser.add_argument(
        "--max-num-seqs", type=positive(int, "--max-num-seqs", 1),
        help="the server's MAX_NUM_SEQS for the default bank (default: the knob)",
    )  # fmt: skip
    parser.add_argument(
        "--os-reserve-gb", type=positive(float, "--os-reserve-gb"),
        help="GiB MemAvailable must stay above (default: the OS_RESERVE_GB knob)",
    )  # fmt: skip
    parser.add_argument(
        "--swap-tolerance-mib", type=positive(float, "--swap-tolerance-mib"), default=0.0,
        help="swap growth still counted as none (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--gen-tokens", type=positive(int, "--gen-tokens", 1), default=2048,
        help="tokens each request generates (default 2048)",
    )  # fmt: skip
    parser.add_argument(
        "--prompt-tokens", type=positive(int, "--prompt-tokens", 16),
        help="fixed prompt length (default: sized so each level fills the KV pool)",
    )  # fmt: skip
    parser.add_argument(
        "--fill", type=positive(float, "--fill"), default=1.0,
        help="share of the KV pool each level's requests add up to (default 1.0)",
    )  # fmt: skip
    parser.add_argument(
        "--pool-tokens", type=positive(int, "--pool-tokens", 1),
        help="KV pool size in tokens when /metrics lacks vllm:cache_config_info",
    )  # fmt: skip
    parser.add_argument(
        "--server-log", type=Path,
        help="a vLLM log to read the pool size from ('GPU KV cache size: N tokens')",
    )  # fmt: skip
    parser.add_argument(
        "--sample-hz", type=positive(float, "--sample-hz", 5.0), default=10.0,
        help="memory samples per second, 5 or more (default 10)",
    )  # fmt: skip
    parser.add_argument(
        "--settle-s", type=positive(float, "--settle-s"), default=3.0,
        help="idle seconds before, between and after phases (default 3)",
    )  # fmt: skip
    parser.add_argument(
        "--progress-s", type=positive(float, "--progress-s", 0.1), default=5.0,
        help="seconds between progress lines (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--guard-record", type=Path,
        help="the memory guard's stop record, to name a guard stop in the verdict "
        f"(default: $HF_HOME/{MARKER_NAME} where HF_HOME is set, as in the container)",
    )  # fmt: skip
    parser.set_defaults(run=run)


def guard_stop(given: Path | None, env: Mapping[str, str], t0_epoch: float) -> GuardStop | None:
    """The guard's record when it stopped vLLM after this run began, placed on its clock."""
    path = given or (Path(env["HF_HOME"]) / MARKER_NAME if env.get("HF_HOME") else None)
    try:
        record = json.loads(path.read_text()) if path is not None else {}
        at = float(record["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return GuardStop(at - t0_epoch, str(record.get("reason", ""))) if at >= t0_epoch else None


def resolve_model(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    if args.model:
        return str(args.model)
    name = env.get("SERVED_MODEL_NAME", "").strip()
    return knob_value("SERVED_MODEL_NAME", env) if name else None


def out_dir(given: Path | None, stem: str) -> Path:
    if given is not None:
        return given
    return Path(f"{stem}-{dt.datetime.now():%Y%m%d-%H%M%S}")


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        return _run(args, env)
    except (UsageError, PlanError, KnobError, PreflightError) as exc:
        print(f"sparkserve stress: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    # Everything is checked before any load.
    reserve = args.os_reserve_gb
    if reserve is None:
        reserve = float(knob_value("OS_RESERVE_GB", env))
    seqs = args.max_num_seqs or int(knob_value("MAX_NUM_SEQS", env))
    bank = parse_bank(args.bank) if args.bank is not None else default_bank(seqs)
    server = Server(args.url or default_url(env), knob_value("API_KEY", env), args.request_timeout)
    pool = args.pool_tokens
    if pool is None and args.server_log is not None:
        try:
            pool = metrics.pool_tokens_from_log(args.server_log.read_text(errors="replace"))
        except OSError as exc:
            raise UsageError(f"bad --server-log {str(args.server_log)!r}: {exc.strerror}") from None
        if pool is None:
            raise UsageError(
                f"bad --server-log {str(args.server_log)!r}: no 'GPU KV cache size' line in it"
            )
    info = server.probe(resolve_model(args, env), pool)
    phases = size_phases(
        bank,
        pool_tokens=info.pool_tokens,
        max_model_len=info.max_model_len,
        gen_tokens=args.gen_tokens,
        prompt_tokens=args.prompt_tokens,
        fill=args.fill,
    )
    out = out_dir(args.out, "stress")
    if out.exists() and not out.is_dir():
        raise UsageError(f"bad --out {str(out)!r}: exists and is not a folder")
    sampler = MemorySampler(args.sample_hz, kv_probe=kv_probe(server, info.model))
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
    started = dt.datetime.now(dt.UTC)
    status, error = "done", None
    sampler.start()
    t0_epoch = time.time() - sampler.now()
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        stress.run()
    except RunAborted as exc:
        status, error = "aborted", str(exc)
    except KeyboardInterrupt:
        status, error = "interrupted", "interrupted (SIGINT): partial results"
        stress.stop()
    finally:
        signal.signal(signal.SIGINT, previous)
        if status == "done":
            time.sleep(min(args.settle_s, 1.0))
        samples = sampler.stop()

    stopped = guard_stop(args.guard_record, env, t0_epoch)
    verdict = judge(samples, reserve, args.swap_tolerance_mib / 1024, stopped)
    if stopped is not None and status == "aborted":
        status = "done"  # the requests failed because the guard stopped vLLM: a verdict
    duration = samples[-1].t - samples[0].t if len(samples) > 1 else 0.0
    phase_dicts = [r.as_dict(samples, sampler.t0) for r in stress.records if r.start_t is not None]
    result: dict[str, Any] = {
        "tool": "sparkserve stress",
        "version": __version__,
        "started_at": started.isoformat(timespec="seconds"),
        "t0_epoch": t0_epoch,
        "status": {"done": verdict.as_dict()["result"], "aborted": "ERROR"}.get(
            status, "INTERRUPTED"
        ),
        "error": error,
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
    write_outputs(out, result, samples, verdict.worst_t, reserve)
    if error:
        say(f"[stress] {error}")
    prefix = "" if status == "done" else "partial run: "
    print(f"{prefix}{verdict.line}", flush=True)
    say(f"[stress] wrote {out}/stress.json, stress.csv, stress.png")
    if status == "aborted":
        return EXIT_ABORTED
    if status == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_PASS if verdict.passed else EXIT_FAIL


def write_outputs(
    out: Path, result: dict[str, Any], samples: list[Sample], worst_t: float | None, reserve: float
) -> None:
    fields = list(Sample.__dataclass_fields__)
    with (out / "stress.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for sample in samples:
            writer.writerow(sample.row())
    try:
        from sparkserve.stress.plot import plot

        title = (
            f"sparkserve stress: {result['model']} at {result['url']}, bank "
            f"{','.join(map(str, result['bank']))} - {result['verdict']['result']}"
            + ("" if result["status"] in ("PASS", "FAIL") else f" ({result['status']})")
        )
        label = "worst moment" if result["verdict"]["result"] == "FAIL" else "lowest MemAvailable"
        plot(samples, result["phases"], reserve, worst_t, title, out / "stress.png", label)
    except ImportError as exc:
        result["files"]["png"] = None
        say(f"[stress] no plot: {exc} (install matplotlib)")
    (out / "stress.json").write_text(json.dumps(result, indent=2) + "\n")
