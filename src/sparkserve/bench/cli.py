"""`sparkserve bench`: TTFT cold against warm on a shared long prefix; decode tokens/s per stream
and in aggregate at each concurrency for prose, code and agent-style prompts; mean acceptance
length (1 + accepted / drafts), acceptance per draft position and prefix-cache hit rate from the
server's /metrics deltas (n/a where the server has no such counters).

Works against any vLLM OpenAI-compatible server, with or without speculative decoding. /metrics
is server-wide: bench a server nobody else is using. Exit status: 0 done, 2 bad input or a
server not usable (checked before any load), 3 a request failed mid-run, 130 interrupted; in
the last two cases what was measured is still written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkserve import __version__
from sparkserve.bench.prompts import KINDS
from sparkserve.bench.report import markdown
from sparkserve.bench.run import Bench, BenchAborted, BenchConfig
from sparkserve.dotenv import DotenvError, with_dotenv
from sparkserve.knobs import KnobError
from sparkserve.stress.cli import (
    EXIT_ABORTED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    UsageError,
    add_server_options,
    default_url,
    knob_value,
    one_line_errors,
    out_dir,
    positive,
    resolve_model,
    say,
)
from sparkserve.stress.plan import PlanError, parse_bank
from sparkserve.stress.server import PreflightError, Server


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "bench",
        help="TTFT, decode speed, speculative acceptance and prefix-cache hits of a server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    one_line_errors(parser, "sparkserve bench")
    add_server_options(parser)
    parser.add_argument(
        "--concurrency", help="levels to measure, e.g. 1,2,3 (default: 1..MAX_NUM_SEQS)"
    )
    parser.add_argument(
        "--max-num-seqs", type=positive(int, "--max-num-seqs", 1),
        help="the server's MAX_NUM_SEQS for the default levels (default: the knob)",
    )  # fmt: skip
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"prompt kinds (default {','.join(KINDS)})"
    )
    parser.add_argument(
        "--gen-tokens", type=positive(int, "--gen-tokens", 2), default=256,
        help="tokens each decode request generates (default 256)",
    )  # fmt: skip
    parser.add_argument(
        "--prefix-tokens", type=positive(int, "--prefix-tokens", 16), default=4096,
        help="length of the shared prefix for the TTFT test (default 4096)",
    )  # fmt: skip
    parser.add_argument(
        "--ttft-rounds", type=positive(int, "--ttft-rounds", 0), default=3,
        help="cold/warm pairs, the median is reported; 0 skips the test (default 3)",
    )  # fmt: skip
    parser.add_argument(
        "--api", choices=("chat", "completions"), default="chat",
        help="the endpoint to send to (default chat: the model's chat template)",
    )  # fmt: skip
    parser.set_defaults(run=run)


def parse_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(","))
    if not text.strip() or any(k not in KINDS for k in kinds) or len(set(kinds)) != len(kinds):
        raise UsageError(f"bad --kinds {text!r}: must be some of {','.join(KINDS)}, each once")
    return kinds


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    try:
        return _run(args, with_dotenv(os.environ if env is None else env, args.env_file))
    except (UsageError, PlanError, KnobError, PreflightError, DotenvError) as exc:
        print(f"sparkserve bench: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    kinds = parse_kinds(args.kinds)
    if args.concurrency is not None:
        levels = parse_bank(args.concurrency, "--concurrency")
    else:
        levels = list(range(1, (args.max_num_seqs or int(knob_value("MAX_NUM_SEQS", env))) + 1))
    server = Server(args.url or default_url(env), knob_value("API_KEY", env), args.request_timeout)
    info = server.probe(resolve_model(args, env))
    if info.max_model_len is not None:
        need = max(args.prefix_tokens + 64, 1024 + args.gen_tokens)
        if need > info.max_model_len:
            raise UsageError(
                f"bad sizes: --prefix-tokens {args.prefix_tokens} / --gen-tokens "
                f"{args.gen_tokens} need {need} tokens; the server's max_model_len is "
                f"{info.max_model_len}"
            )
    out = out_dir(args.out, "bench")
    if out.exists() and not out.is_dir():
        raise UsageError(f"bad --out {str(out)!r}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    config = BenchConfig(
        kinds=kinds,
        concurrency=tuple(levels),
        gen_tokens=args.gen_tokens,
        prefix_tokens=args.prefix_tokens,
        ttft_rounds=args.ttft_rounds,
        api=args.api,
    )
    say(
        f"[bench] {server.url} model {info.model}: kinds {','.join(kinds)}, concurrency "
        f"{','.join(map(str, levels))}, {args.gen_tokens} tokens per request; writing to {out}/"
    )
    bench = Bench(server, info.model, config, say=say)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    status, error, measured = "done", None, {}
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        measured = bench.run()
    except BenchAborted as exc:
        status, error = "aborted", str(exc)
    except KeyboardInterrupt:
        status, error = "interrupted", "interrupted (SIGINT): partial results"
    finally:
        signal.signal(signal.SIGINT, previous)
    if status != "done":
        measured = getattr(bench, "partial", {"ttft": None, "decode": []})
    result: dict[str, Any] = {
        "tool": "sparkserve bench",
        "version": __version__,
        "started_at": started,
        "status": {"done": "DONE", "aborted": "ERROR"}.get(status, "INTERRUPTED"),
        "error": error,
        "url": server.url,
        "model": info.model,
        "max_model_len": info.max_model_len,
        "config": {
            "kinds": list(kinds),
            "concurrency": levels,
            "gen_tokens": args.gen_tokens,
            "prefix_tokens": args.prefix_tokens,
            "ttft_rounds": args.ttft_rounds,
            "api": args.api,
        },
        "ttft": measured.get("ttft"),
        "decode": measured.get("decode", []),
        "acceptance_by_kind": measured.get("acceptance_by_kind"),
        "overall": measured.get("overall"),
        "files": {"json": "bench.json", "markdown": "bench.md", "png": "bench.png"},
    }
    write_outputs(out, result)
    if error:
        say(f"[bench] {error}")
    print(markdown(result), end="", flush=True)
    say(f"[bench] wrote {out}/bench.json, bench.md, bench.png")
    if status == "aborted":
        return EXIT_ABORTED
    return EXIT_INTERRUPTED if status == "interrupted" else 0


def write_outputs(out: Path, result: dict[str, Any]) -> None:
    try:
        from sparkserve.bench.report import plot

        plot(result, out / "bench.png")
    except ImportError as exc:
        result["files"]["png"] = None
        say(f"[bench] no plot: {exc} (install matplotlib)")
    (out / "bench.md").write_text(markdown(result))
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
