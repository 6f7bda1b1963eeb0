"""Decode and prefill speed of the default recipe's geometry on a borrowed CUDA host, against
the bytes a decode step must read (benchmarks/gpu/h200.sh decode-speed).

serve.sh as shipped, as `sparkserve selftest`'s `plain` (int8 head) and `bf16` (bf16 head)
cases start it: the recipe's config.json (its MoE shape and int4 AutoRound quantization_config)
with --layers of its 48 layers and `--load-format dummy`, no speculation, prefix caching on.
For each head: decode tok/s at 1, 2, 4 and 8 concurrent streams (ignore_eos, greedy), then,
for the int8 head, prefill tok/s at 2k/8k/32k prompt tokens (TTFT of a prompt no cache holds)
and the TTFT of the next turn whose prefix is cached. Before any server starts, the GPU's
device-to-device copy bandwidth is measured with torch (bytes read + written / time).

    python3 benchmarks/gpu/decode_speed.py --out DIR [--layers 48] [--streams 1,2,4,8]
        [--heads int8,bf16] [--prefill 2048,8192,32768] [--gen-tokens 256]

Writes DIR/decode_speed.json (the GPU, vLLM, the settings, the geometry, every figure, and for
each decode figure the model's bytes per step (sparkserve.plan.step_bytes) and the ratio of the
measured step time to bytes / measured copy bandwidth) and DIR/decode_speed.png. The bytes are
a model, the step times measurements; the ratio is what carries from this GPU to a Spark.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from served import (
    case_server,
    gpu_name,
    ints,
    names,
    random_ids,
    run_streams,
    save_figure,
    settings,
    write_json,
)

from sparkserve.plan.step_bytes import (
    BANDWIDTHS_GBS,
    StepBytes,
    geometry,
    quantization,
    step_bytes,
)

HEAD_CASES = {"int8": "plain", "bf16": "bf16"}  # sparkserve selftest's cases
PROMPT_TOKENS = 64  # the decode runs' prompt
NEXT_TURN_TOKENS = 64  # new tokens after a cached prefix


def say(line: str) -> None:
    print(f"decode_speed: {line}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--streams", default="1,2,4,8")
    parser.add_argument("--heads", default="int8,bf16")
    parser.add_argument("--prefill", default="2048,8192,32768")
    parser.add_argument("--gen-tokens", type=int, default=256)
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    parser.add_argument("--copy-gib", type=float, default=2.0)
    args = parser.parse_args(argv)
    try:
        args.streams = ints(args.streams, "--streams", 1, 64)
        args.prefill = ints(args.prefill, "--prefill", 16, 262144)
        args.heads = names(args.heads, "--heads", HEAD_CASES)
        (args.layers,) = ints(str(args.layers), "--layers", 1, 48)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    if args.gen_tokens < 8:
        parser.error(f"--gen-tokens {args.gen_tokens}: at least 8")
    return args


# ------------------------------------------------------------------ figures (CPU-testable)


def decode_summary(chunk_times: Sequence[Sequence[float]]) -> dict[str, float]:
    """One decode run's figures from each stream's token arrival times (one token a chunk,
    no speculation): the median gap between tokens is the step time; per-stream tok/s is
    (tokens - 1) / (last - first), aggregate tok/s their sum."""
    gaps: list[float] = []
    rates: list[float] = []
    for times in chunk_times:
        if len(times) < 2:
            raise ValueError("a stream with fewer than 2 tokens: no decode rate")
        gaps += [b - a for a, b in itertools.pairwise(times)]
        rates.append((len(times) - 1) / (times[-1] - times[0]))
    return {
        "streams": len(chunk_times),
        "step_s_median": statistics.median(gaps),
        "tok_s_per_stream_median": statistics.median(rates),
        "tok_s_aggregate": sum(rates),
    }


def model_ratio(step_s: float, bytes_per_step: float, copy_gbs: float) -> float:
    """Measured step time over the time the step's bytes take at the measured copy bandwidth:
    1.0 is the memory limit; what is above it is time not spent reading."""
    return step_s / (bytes_per_step / (copy_gbs * 1e9))


def bytes_for(config: Mapping[str, Any], head: str, streams: int, context: int) -> StepBytes:
    return step_bytes(
        geometry(config), quantization(config), head=head, context=context, streams=streams
    )


def decode_row(
    config: Mapping[str, Any], head: str, summary: Mapping[str, float], context: int,
    copy_gbs: float | None,
) -> dict[str, Any]:  # fmt: skip
    """A decode figure with the model beside it: bytes by kind, the ratio (when the copy
    bandwidth was measured) and the ceiling at that bandwidth."""
    step = bytes_for(config, head, int(summary["streams"]), context)
    row: dict[str, Any] = {
        "head": head, **summary, "context_mean": context,
        "model_bytes_per_step": step.total, "model_bytes_by_kind": step.by_kind,
        "model_lm_head_share": step.share("lm_head"),
    }  # fmt: skip
    if copy_gbs:
        row["ratio_step_to_bytes_over_copy_bw"] = model_ratio(
            summary["step_s_median"], step.total, copy_gbs
        )
        row["model_ceiling_tok_s_at_copy_bw"] = step.streams * copy_gbs * 1e9 / step.total
    return row


def int8_gain(rows: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """int8 head tok/s over bf16 head tok/s (per stream), by stream count, where both ran."""
    by = {(r["head"], r["streams"]): r["tok_s_per_stream_median"] for r in rows}
    return {
        s: by[("int8", s)] / by[("bf16", s)]
        for (head, s) in by
        if head == "int8" and ("bf16", s) in by
    }


def write_png(path: Path, record: Mapping[str, Any]) -> None:
    """Decode tok/s per stream by stream count for each head, with the model's ceiling at the
    measured copy bandwidth; prefill tok/s by prompt length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for head in ("int8", "bf16"):
        rows = [r for r in record["decode"] if r["head"] == head]
        if not rows:
            continue
        streams = [r["streams"] for r in rows]
        left.plot(streams, [r["tok_s_per_stream_median"] for r in rows], "o-",
                  label=f"{head} head, measured")  # fmt: skip
        ceiling = [r.get("model_ceiling_tok_s_at_copy_bw") for r in rows]
        if all(c is not None for c in ceiling):
            left.plot(streams, [c / s for c, s in zip(ceiling, streams, strict=True)], "--",
                      label=f"{head} head, bytes / copy bandwidth (model)")  # fmt: skip
    left.set_xscale("log", base=2)
    left.set_xlabel("concurrent streams")
    left.set_ylabel("decode tok/s per stream")
    left.legend(fontsize=7)
    prefill = record.get("prefill") or []
    if prefill:
        right.plot([p["prompt_tokens"] for p in prefill], [p["prefill_tok_s"] for p in prefill],
                   "o-", label="prefill tok/s (uncached)")  # fmt: skip
        right.set_xscale("log", base=2)
        right.set_xlabel("prompt tokens")
        right.set_ylabel("prefill tok/s")
        right.legend(fontsize=7)
    save_figure(
        figure, path,
        f"{record['gpu']}, vLLM {record['vllm']}, {record['settings']['layers']} of "
        f"{record['geometry']['full_depth_layers']} layers, dummy int4 weights",
    )  # fmt: skip


# ------------------------------------------------------------------ the GPU run


def copy_bandwidth_gbs(gib: float, repeats: int = 20) -> float:
    """Device-to-device copy: (bytes read + bytes written) / time, best of `repeats`."""
    import torch

    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 2 / best / 1e9


def measure_head(
    head: str, args: argparse.Namespace, config: dict[str, Any], models: Any, copy_gbs: float,
    work: Path, rng: random.Random,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str, dict[str, str]]:  # fmt: skip
    from sparkserve.selftest import cases

    case = cases.CASES[HEAD_CASES[head]]
    port = cases.free_port()
    key = f"decode-speed-{port}"
    base = dict(os.environ)
    base.setdefault("MAX_NUM_SEQS", str(max(args.streams)))
    env = cases.case_env(case, models, base, port, key, work / f"head-report-{head}")
    log = work / f"server-{head}.log"
    decode: list[dict[str, Any]] = []
    prefill: list[dict[str, Any]] = []
    with case_server(case, env, log, args.start_timeout_s, say) as running:
        version = running.server.vllm_version()
        vocab = int(config["vocab_size"])

        def stream(ids: list[int], gen: int) -> Any:
            return running.server.stream_completion(cases.SERVED_NAME, ids, gen)

        run_streams(stream, 1, 16, vocab, rng, PROMPT_TOKENS)  # warm: CUDA graphs, first-call costs
        for count in args.streams:
            results = run_streams(stream, count, args.gen_tokens, vocab, rng, PROMPT_TOKENS)
            errors = [r.error for r in results if r.error]
            if errors:
                raise RuntimeError(f"{head} head, {count} streams: {errors[0]}")
            summary = decode_summary([r.chunk_times for r in results])
            row = decode_row(config, head, summary, PROMPT_TOKENS + args.gen_tokens // 2,
                             copy_gbs)  # fmt: skip
            decode.append(row)
            say(
                f"{head} head, {count} streams: {summary['tok_s_per_stream_median']:.1f} tok/s "
                f"a stream, ratio {row.get('ratio_step_to_bytes_over_copy_bw', 0):.2f}"
            )
        if head == "int8":
            for tokens in args.prefill:
                ids = random_ids(tokens, vocab, rng)
                cold = stream(ids, 1)
                warm = stream(ids + random_ids(NEXT_TURN_TOKENS, vocab, rng), 1)
                if cold.error or warm.error or cold.ttft_s is None or warm.ttft_s is None:
                    raise RuntimeError(f"prefill {tokens}: {cold.error or warm.error}")
                prefill.append({
                    "prompt_tokens": tokens, "ttft_uncached_s": cold.ttft_s,
                    "prefill_tok_s": tokens / cold.ttft_s,
                    "next_turn_new_tokens": NEXT_TURN_TOKENS,
                    "ttft_prefix_cached_s": warm.ttft_s,
                })  # fmt: skip
                say(
                    f"prefill {tokens}: {tokens / cold.ttft_s:.0f} tok/s, TTFT "
                    f"{cold.ttft_s:.2f} s uncached, {warm.ttft_s:.2f} s next turn cached"
                )
    return decode, prefill, version, settings(env)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from sparkserve.knobs.registry import BY_NAME
    from sparkserve.memory.checkpoint import hf_home
    from sparkserve.selftest.models import keep_models, models_home

    recipe = os.environ.get("RECIPE") or BY_NAME["RECIPE"].default
    models = keep_models(models_home(hf_home(), recipe, args.layers), recipe, args.layers)
    config = json.loads((models.target / "config.json").read_text())
    work = args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    say(f"{recipe}: {models.layers} of {models.full_layers} layers, no weights")
    copy_gbs = copy_bandwidth_gbs(args.copy_gib)
    say(f"copy bandwidth {copy_gbs:.0f} GB/s (read + write)")
    rng = random.Random(52)
    record: dict[str, Any] = {
        "what": "decode and prefill speed, dummy weights, no speculation; model_* fields are "
                "a model (sparkserve.plan.step_bytes), not a measurement",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join([sys.executable, *sys.argv]),
        "gpu": gpu_name(), "host": platform.node(), "vllm": "unknown",
        "copy_bandwidth_gbs": copy_gbs,
        "datasheet_bandwidths_gbs": BANDWIDTHS_GBS,
        "geometry": {"recipe": recipe, "full_depth_layers": models.full_layers,
                     "config": {k: v for k, v in config.items() if k != "layer_types"}},
        "settings": {"layers": models.layers, "gen_tokens": args.gen_tokens,
                     "prompt_tokens": PROMPT_TOKENS},
        "decode": [], "prefill": [],
    }  # fmt: skip
    status = 0
    for head in args.heads:
        try:
            decode, prefill, version, settings = measure_head(
                head, args, config, models, copy_gbs, work, rng
            )
        except RuntimeError as error:
            say(str(error))
            record.setdefault("errors", []).append(str(error))
            status = 1
            continue
        record["decode"] += decode
        record["prefill"] += prefill
        record["vllm"] = version
        record["settings"][f"{head}_head_knobs"] = settings
        write_json(args.out / "decode_speed.json", record)  # what is done so far
    record["int8_head_gain_by_streams"] = int8_gain(record["decode"])
    write_json(args.out / "decode_speed.json", record)
    if record["decode"]:
        write_png(args.out / "decode_speed.png", record)
    return status


if __name__ == "__main__":
    sys.exit(main())
