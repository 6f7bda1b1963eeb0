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
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkserve import __version__
from sparkserve.bench.report import markdown
from sparkserve.bench.run import Bench, BenchConfig
from sparkserve.client import tool
from sparkserve.client.bank import parse_bank
from sparkserve.client.prompts import KINDS, parse_kinds
from sparkserve.client.tool import UsageError, say
from sparkserve.command_line import EXIT_OK, NumberOption
from sparkserve.launch.settings import tool_settings
from sparkserve.output.atomic_file import replace_text

INF = math.inf
NUMBER_OPTIONS: tuple[NumberOption, ...] = (
    ("--gen-tokens", int, 2, INF, 256, "tokens each decode request generates (default 256)"),
    # two of the 4480-token units stock vLLM caches prefixes in with DFlash on the Spark
    # geometry (the image's patch: 2240 for a shared prefix; docs/FINDINGS.md, "Prefix caching
    # with DFlash on a hybrid target"): a 4096-token prefix would not hit on stock
    ("--prefix-tokens", int, 16, INF, 9216,
     "length of the shared prefix for the TTFT test (default 9216)"),
    ("--ttft-rounds", int, 0, INF, 3,
     "cold/warm pairs, the median is reported; 0 skips the test (default 3)"),
)  # fmt: skip


def own_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"prompt kinds (default {','.join(KINDS)})"
    )
    parser.add_argument(
        "--api", choices=("chat", "completions"), default="chat",
        help="the endpoint to send to (default chat: the model's chat template)",
    )  # fmt: skip


def _run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    kinds = parse_kinds(args.kinds)
    settings = tool_settings(env)
    if args.concurrency is not None:
        levels = parse_bank(args.concurrency, "--concurrency")
    else:
        levels = list(range(1, tool.max_num_seqs(args, settings) + 1))
    server, info = tool.connect(args, settings)
    if info.max_model_len is not None:
        need = max(args.prefix_tokens + 64, 1024 + args.gen_tokens)
        if need > info.max_model_len:
            raise UsageError(
                f"bad sizes: --prefix-tokens {args.prefix_tokens} / --gen-tokens "
                f"{args.gen_tokens} need {need} tokens; the server's max_model_len is "
                f"{info.max_model_len}"
            )
    out = tool.output_folder(args.out, "bench")
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
    measured: dict[str, Any] = {}

    def work() -> None:
        measured.update(bench.run())

    outcome = tool.run_cut_short(work)
    if outcome.status != "done":
        measured = getattr(bench, "partial", {"ttft": None, "decode": []})
    result: dict[str, Any] = {
        "tool": COMMAND.prog,
        "version": __version__,
        "started_at": started,
        "status": outcome.label("DONE"),
        "error": outcome.error,
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
    tool.report(out, result, outcome, markdown(result))
    return outcome.exit_code(EXIT_OK)


def write_outputs(out: Path, result: dict[str, Any]) -> None:
    def draw() -> None:
        from sparkserve.bench.report import plot

        plot(result, out / "bench.png")

    tool.write_result(out, result, draw)
    replace_text(out / "bench.md", markdown(result))


COMMAND = tool.LoadCommand(
    "bench", "TTFT, decode speed, speculative acceptance and prefix-cache hits of a server",
    ("--concurrency", "levels to measure, e.g. 1,2,3 (default: 1..MAX_NUM_SEQS)"),
    NUMBER_OPTIONS, own_options, _run,
)  # fmt: skip
add_command = COMMAND.add_command
