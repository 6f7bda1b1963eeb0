"""Speculation's cost curve on a borrowed CUDA host (benchmarks/gpu/h200.sh spec-cost): the
step of DFlash n=12 and of MTP n=2 against a plain step, at every acceptance, and the tok/s a
Spark user can read their own acceptance against.

serve.sh / mtp_serve.sh as shipped, as `sparkserve selftest`'s `plain`, `dflash` and `mtp`
cases start them: the recipe's geometry with --layers of its layers and `--load-format dummy`.
With random weights the drafters propose and the target accepts nothing; for the speculative
cases this script's own vLLM plugin (spec_accept.py, on these servers' PYTHONPATH alone) sets
how many drafts each step accepts while the server runs: vLLM's own choice (about 0 here),
exactly k for k = 0..n, and every draft (tests/cpu_shims' accept-all-drafts fault). For each
setting and stream count: greedy streams of random prompts, each chunk's arrival time and
token count (vLLM's return_token_ids), the spec-decode counters around the run.

    python3 benchmarks/gpu/spec_cost.py --out DIR [--cases plain,dflash,mtp] [--layers 48]
        [--streams 1,2] [--steps 64] [--dflash-tokens 12] [--mtp-tokens 2] [--deadline-s S]
    python3 benchmarks/gpu/spec_cost.py --out DIR --merge A.json B.json ...

Writes DIR/spec_cost.json and DIR/spec_cost.png after each case. The step times are
measurements; tok/s at a mean accepted length a between the measured whole numbers, and any
figure for a Spark, are a model (fields model_*), as the record says. --merge joins the
records of several calls (each call measures the cases it was given; one GPU for all) and
derives the model anew.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import re
import shutil
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
    run_streams,
    save_figure,
    settings,
    write_json,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CASES = ("plain", "dflash", "mtp")  # sparkserve selftest's cases of the same names
PROMPT_TOKENS = 64
WARM_STEPS = 4  # a short stream after each change of setting: first-call costs off the clock
MIN_CASE_S = 150.0  # a case is not started with less of the deadline left (a warm start + runs)
MEASURE_RESERVE_S = 60.0  # of a case's time, kept for its measurements after the start
PLAIN_MAX_NUM_SEQS = 8  # decode_speed.py's (its --streams 1,2,4,8)
ALL = "all"
SAMPLER_LINE = re.compile(r"spec_cost: (.+?) sampler: drafts accepted as")
DECODE_TIME = "vllm:request_decode_time_seconds"  # a histogram: _sum, _count
OWN = "own"
PLUGIN = "sparkserve_spec_accept"
SWITCH_ENV = "SPARKSERVE_SPEC_COST_ACCEPT"  # spec_accept.ENV
# Published for this model on one DGX Spark (GB10), as issue 52 quotes them: decode tok/s at
# one stream. Not measured here; drawn beside the model for a reader's comparison.
PUBLISHED_SPARK = {
    "plain": {"low": 28.0, "high": 28.0, "what": "int4, no speculation"},
    "dflash": {"low": 33.0, "high": 81.0, "what": "DFlash n=12, by kind of text"},
    "mtp": {"low": 40.0, "high": 51.0, "what": "MTP n=2"},
}
PUBLISHED_NOTE = ("published figures for this model on one DGX Spark (GB10), quoted in issue 52; "
                  "not measured here")  # fmt: skip
MODEL_NOTE = (
    "the step times are the server's (vLLM's request decode time over the steps taken; the "
    "client's chunk times beside them, step_s_median); "
    "model: a step's time at a mean accepted length a is interpolated linearly between the "
    "steps measured at whole numbers of accepted drafts; tok/s(a) = (a + 1) / step(a); "
    "model_spark_tok_s = the published plain Spark figure x this GPU's speedup over its own plain "
    "step (assumes the step-cost ratios carry from this GPU to a GB10)"
)


def say(line: str) -> None:
    print(f"spec_cost: {line}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--streams", default="1,2")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--dflash-tokens", type=int, default=12)
    parser.add_argument("--mtp-tokens", type=int, default=2)
    parser.add_argument("--start-timeout-s", type=float, default=420.0)
    parser.add_argument("--deadline-s", type=float, default=None)
    parser.add_argument("--geometry", default=None, help="a recipe (default: RECIPE) or 'tiny'")
    parser.add_argument("--merge", type=Path, nargs="+", default=None)
    args = parser.parse_args(argv)
    try:
        args.streams = ints(args.streams, "--streams", 1, 8)
        args.cases = names(args.cases, "--cases", CASES)
        (args.layers,) = ints(str(args.layers), "--layers", 1, 48)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    if args.steps < 8:
        parser.error(f"--steps {args.steps}: at least 8")
    if not 1 <= args.dflash_tokens <= 15:  # the drafter's block of 16 holds n + 1
        parser.error(f"--dflash-tokens {args.dflash_tokens}: from 1 to 15")
    if not 1 <= args.mtp_tokens <= 8:
        parser.error(f"--mtp-tokens {args.mtp_tokens}: from 1 to 8")
    if args.deadline_s is not None and args.deadline_s <= 0:
        parser.error(f"--deadline-s {args.deadline_s}: a positive number of seconds")
    for path in args.merge or ():
        if not path.is_file():
            parser.error(f"--merge {path}: no such file")
    return args


# ------------------------------------------------------------------ figures (CPU-testable)


def run_figures(
    chunk_times: Sequence[Sequence[float]], chunk_tokens: Sequence[Sequence[int]],
    tokens_per_step: float,
) -> dict[str, float]:  # fmt: skip
    """One run's figures from each stream's chunk arrival times and the tokens each chunk
    carried. The first chunk is the prefill's; after it, a stream's tok/s is its tokens over
    the time to its last chunk, and its step time that time over the steps it took (its tokens
    / tokens_per_step, from the server's counters: 1 + accepted / drafts)."""
    if len(chunk_times) != len(chunk_tokens) or not chunk_times:
        raise ValueError("one list of chunk tokens for each stream's chunk times")
    rates: list[float] = []
    steps: list[float] = []
    gaps: list[float] = []
    carried: list[int] = []
    for times, tokens in zip(chunk_times, chunk_tokens, strict=True):
        if len(times) != len(tokens):
            raise ValueError("a stream's chunks without their token counts (return_token_ids)")
        if len(times) < 2:
            raise ValueError("a stream with fewer than 2 chunks: no decode rate")
        span = times[-1] - times[0]
        after_first = sum(tokens[1:])
        rates.append(after_first / span)
        steps.append(span / (after_first / tokens_per_step))
        gaps += [b - a for a, b in itertools.pairwise(times)]
        carried += tokens[1:]
    return {
        "streams": len(chunk_times),
        "tokens_per_step": tokens_per_step,
        "step_s_median": statistics.median(steps),
        "tok_s_per_stream_median": statistics.median(rates),
        "tok_s_aggregate": sum(rates),
        "chunk_gap_s_median": statistics.median(gaps),
        "tokens_per_chunk_mean": statistics.fmean(carried),
        "tokens_per_chunk_max": max(carried),
        "chunks_per_step": tokens_per_step / statistics.fmean(carried),
    }


def server_step_s(
    decode_s_sum: float | None, requests: float | None, tokens_after_first: float,
    tokens_per_step: float,
) -> float | None:  # fmt: skip
    """The step time by the server's own clock: vLLM's request decode time (first token to
    last) summed over the run's requests, over the steps they took; None without it."""
    if not decode_s_sum or not requests:
        return None
    return decode_s_sum / (tokens_after_first / tokens_per_step)


def step_of(run: Mapping[str, Any]) -> float:
    """The step time the model uses: the server's clock where the run has it (it does not wait
    on the client's threads), else the client's chunk times."""
    return run.get("server_step_s") or run["step_s_median"]


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Linear interpolation through (x, y) points sorted by x; x within their range."""
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise ValueError(f"{x} outside the measured {points[0][0]}..{points[-1][0]}")


def step_points(runs: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """(accepted drafts per step, step time) of a case's runs at one stream count: the runs at
    a set count k where there are any (the accept-all run where k = n was not run), else the
    runs at vLLM's own acceptance and at all, at the acceptance the counters measured."""
    fixed = {r["accept"]: r for r in runs if isinstance(r["accept"], int)}
    for run in runs:
        if run["accept"] == ALL and run["num_spec_tokens"] not in fixed:
            fixed[run["num_spec_tokens"]] = run
    chosen = fixed.values() if len(fixed) >= 2 else runs
    points = {round(r["tokens_per_step"] - 1.0, 6): step_of(r) for r in chosen}
    return sorted(points.items())


def curve(
    points: Sequence[tuple[float, float]], plain_step_s: float, published_plain: float,
    every: float = 0.1,
) -> list[dict[str, float]]:  # fmt: skip
    """The model: tok/s a stream at mean accepted length a from the interpolated step time,
    its speedup over the plain step, and that speedup times the published plain Spark figure."""
    low, high = points[0][0], points[-1][0]
    out = []
    for i in range(round((high - low) / every) + 1):
        a = min(high, low + i * every)
        step = interpolate(points, a)
        speedup = (a + 1.0) / step * plain_step_s
        out.append({"a": round(a, 6), "model_step_s": step, "model_tok_s": (a + 1.0) / step,
                    "model_speedup": speedup,
                    "model_spark_tok_s": published_plain * speedup})  # fmt: skip
    return out


def implied_a(
    points: Sequence[tuple[float, float]], plain_step_s: float, speedup: float
) -> float | None:
    """The smallest a whose modelled speedup over the plain step reaches `speedup`: within a
    segment of the interpolated step times, (a + 1) t_plain / (t0 + slope (a - a0)) = speedup
    solved for a; None where even the most accepted point falls short."""
    for (a0, t0), (a1, t1) in itertools.pairwise(points):
        slope = (t1 - t0) / (a1 - a0)
        s0, s1 = (a0 + 1) * plain_step_s / t0, (a1 + 1) * plain_step_s / t1
        if s0 >= speedup:
            return a0
        if s0 < speedup <= s1:
            return (speedup * (t0 - slope * a0) - plain_step_s) / (plain_step_s - speedup * slope)
    return None


def derive(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per speculative case and stream count, beside the plain run of that stream count: the
    step ratios measured and the model curve, with what the published Spark figures imply."""
    plain = {r["streams"]: r for r in runs if r["case"] == "plain"}
    published_plain = PUBLISHED_SPARK["plain"]["low"]
    out: dict[str, Any] = {"what": MODEL_NOTE, "cases": {}}
    for case in ("dflash", "mtp"):
        for streams in sorted({r["streams"] for r in runs if r["case"] == case}):
            if streams not in plain:
                continue
            mine = [r for r in runs if r["case"] == case and r["streams"] == streams]
            points = step_points(mine)
            if len(points) < 2:
                continue
            t_plain = step_of(plain[streams])
            model = curve(points, t_plain, published_plain)
            published = PUBLISHED_SPARK[case]
            implied = {
                str(v): implied_a(points, t_plain, v / published_plain)
                for v in (published["low"], published["high"])
            }
            even = implied_a(points, t_plain, 1.0)
            out["cases"].setdefault(case, {})[str(streams)] = {
                "num_spec_tokens": mine[0]["num_spec_tokens"],
                "plain_step_s": t_plain,
                "plain_tok_s_per_stream": 1.0 / t_plain,
                "measured_step_s_by_accepted": {str(a): t for a, t in points},
                "measured_step_over_plain_by_accepted": {str(a): t / t_plain for a, t in points},
                "measured_step_over_plain_at_0": points[0][1] / t_plain,
                "measured_step_over_plain_at_full": points[-1][1] / t_plain,
                "model_break_even_a": even,
                "model_a_implied_by_published_spark_tok_s": implied,
                "model_curve": model,
            }  # fmt: skip
    return out


def same_kind(key: str, value: Any) -> Any:
    """What must match for two calls' runs to be compared: the GPU's model (nvidia-smi's first
    field: two machines of one kind may differ in driver), the whole geometry."""
    return value.split(",")[0].strip() if key == "gpu" else value


def merge(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several calls' records as one: their calls in order, each case's runs from the last call
    that measured it. One GPU and one geometry for all, else ValueError naming both."""
    if not records:
        raise ValueError("no record to merge")
    first = records[0]
    out: dict[str, Any] = {k: v for k, v in first.items() if k not in ("calls", "runs")}
    out["calls"], out["runs"], out["errors"] = [], [], []
    latest: dict[str, int] = {}
    for record in records:
        for key in ("gpu", "geometry"):
            if same_kind(key, record[key]) != same_kind(key, first[key]):
                mine, theirs = json.dumps(first[key])[:80], json.dumps(record[key])[:80]
                raise ValueError(f"{key}: {theirs} in one record, {mine} in another")
        base = len(out["calls"])
        for call in record["calls"]:
            out["calls"].append({**call, "call": base + call["call"]})
        for run in record["runs"]:
            out["runs"].append({**run, "call": base + run["call"]})
            latest[run["case"]] = base + run["call"]
        out["errors"] += record.get("errors", [])
    out["runs"] = [r for r in out["runs"] if r["call"] == latest[r["case"]]]
    out["derived"] = derive(out["runs"])
    return out


def write_png(path: Path, record: Mapping[str, Any]) -> None:
    """Left: tok/s a stream on this GPU by mean accepted length, measured points and the model,
    with the plain step's line. Right: the same speedups on the published plain Spark figure
    (a model), with the published Spark ranges as bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"dflash": "tab:blue", "mtp": "tab:orange", "plain": "tab:gray"}
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    derived = record["derived"]["cases"]
    plain_drawn = False
    for case, by_streams in derived.items():
        entry = by_streams.get("1") or next(iter(by_streams.values()))
        streams = next(s for s, e in by_streams.items() if e is entry)
        n = entry["num_spec_tokens"]
        model = entry["model_curve"]
        a = [p["a"] for p in model]
        name = f"{case} n={n}, {streams} stream(s)"
        left.plot(a, [p["model_tok_s"] for p in model], "-", color=colours[case],
                  label=f"{name}: model")  # fmt: skip
        measured = [r for r in record["runs"]
                    if r["case"] == case and r["streams"] == int(streams)]  # fmt: skip
        left.plot([r["tokens_per_step"] - 1 for r in measured],
                  [r["tokens_per_step"] / step_of(r) for r in measured], "o", color=colours[case],
                  label=f"{name}: measured")  # fmt: skip
        if not plain_drawn:
            plain = f"plain (no speculation), {streams} stream(s): measured"
            left.axhline(entry["plain_tok_s_per_stream"], color=colours["plain"], ls="--",
                         label=plain)  # fmt: skip
            plain_drawn = True
        scaled = f"{name}: model (this GPU's speedup x {PUBLISHED_SPARK['plain']['low']:g})"
        right.plot(a, [p["model_spark_tok_s"] for p in model], "-", color=colours[case],
                   label=scaled)  # fmt: skip
        published = PUBLISHED_SPARK[case]
        right.axhspan(published["low"], published["high"], color=colours[case], alpha=0.15,
                      label=f"published, GB10, not measured here: {published['what']} "
                            f"{published['low']:g}-{published['high']:g} tok/s")  # fmt: skip
    right.axhline(PUBLISHED_SPARK["plain"]["low"], color=colours["plain"], ls="--",
                  label="published, GB10, not measured here: int4 plain 28 tok/s")  # fmt: skip
    xlabel = "mean accepted drafts per step a (vLLM's 'mean acceptance length' is a + 1)"
    left.set_xlabel(xlabel, fontsize=8)
    left.set_ylabel(f"decode tok/s a stream on this GPU ({record['gpu'].split(',')[0]})",
                    fontsize=8)  # fmt: skip
    left.legend(fontsize=6)
    right.set_xlabel(xlabel, fontsize=8)
    right.set_ylabel("decode tok/s a stream on a GB10 (model), published bands", fontsize=8)
    right.legend(fontsize=6)
    geometry = record["geometry"]
    save_figure(
        figure, path,
        f"Speculation's cost: {record['gpu']}, vLLM {record['vllm']}, {geometry['layers']} of "
        f"{geometry['full_depth_layers']} layers, dummy int4 weights; lines between the "
        f"measured points are a model",
    )  # fmt: skip


def finish(out: Path, record: dict[str, Any]) -> None:
    record["derived"] = derive(record["runs"])
    write_json(out / "spec_cost.json", record)
    if record["derived"]["cases"]:
        write_png(out / "spec_cost.png", record)


# ------------------------------------------------------------------ the GPU run


def accept_plugin(work: Path) -> Path:
    """A folder that makes spec_accept.py a vLLM general plugin for the Python that has it on
    its path (and only for that one)."""
    folder = work / "accept-plugin"
    info = folder / f"{PLUGIN}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / "spec_accept.py", folder / f"{PLUGIN}.py")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\n{PLUGIN} = {PLUGIN}:register\n"
    )
    return folder


def settings_for(case: str, n: int) -> list[int | str]:
    """vLLM's own acceptance, exactly 0 and n, every draft, then exactly k for 0 < k < n: the
    ends first, should the deadline stop a case early."""
    return [] if case == "plain" else [OWN, 0, n, ALL, *range(1, n)]


def measure_case(
    name: str, args: argparse.Namespace, models: Any, base: Mapping[str, str], vocab: int,
    work: Path, rng: random.Random, call: int, deadline: float,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    from sparkserve.client import metrics
    from sparkserve.selftest import cases

    case = cases.CASES[name]
    n = {"dflash": args.dflash_tokens, "mtp": args.mtp_tokens}.get(name, 0)
    port = cases.free_port()
    env = cases.case_env(case, models, base, port, f"spec-cost-{port}", work / f"head-{name}")
    # plain as decode_speed.py starts it (vLLM hashes max_num_seqs into its compile cache, so
    # that run's cache serves this start); the speculative servers capture fewer graphs
    seqs = PLAIN_MAX_NUM_SEQS if name == "plain" else max(args.streams)
    env.setdefault("MAX_NUM_SEQS", str(seqs))
    switch = work / f"accept-{name}"
    switch.unlink(missing_ok=True)
    if case.speculative:
        env["NUM_SPEC_TOKENS"] = str(n)
        plugin = accept_plugin(work)
        shims = REPO / "tests" / "cpu_shims" / "src"  # the accept-all-drafts fault
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(plugin), str(shims), env.get("PYTHONPATH", "")) if p
        )
        env[SWITCH_ENV] = str(switch)
    timeout = min(args.start_timeout_s, deadline - time.monotonic() - MEASURE_RESERVE_S)
    runs: list[dict[str, Any]] = []
    began = time.monotonic()
    log = work / f"server-{name}.log"
    with case_server(case, env, log, timeout, say) as running:
        server = {"case": name, "call": call, "healthy_s": time.monotonic() - began,
                  "vllm": running.server.vllm_version(), "knobs": settings(env)}  # fmt: skip

        def stream(ids: list[int], gen: int) -> Any:
            body = {"prompt": ids, "return_token_ids": True}
            return running.server.stream("/v1/completions", cases.SERVED_NAME, body, gen)

        for accept in settings_for(name, n) or [OWN]:
            if deadline - time.monotonic() < 15:
                say(f"{name}: the deadline is near; settings from {accept} on not measured")
                break
            if accept == OWN:
                switch.unlink(missing_ok=True)
            else:
                switch.write_text(f"{accept}\n")
            per_step = 1 if accept == OWN else n + 1 if accept == ALL else int(accept) + 1
            run_streams(stream, 1, 1 + WARM_STEPS * per_step, vocab, rng, PROMPT_TOKENS)
            after = running.server.settled_metrics()
            for count in args.streams:
                before = after  # settled: the counters of every step before this run
                results = run_streams(stream, count, 1 + args.steps * per_step, vocab, rng,
                                      PROMPT_TOKENS)  # fmt: skip
                after = running.server.settled_metrics()
                errors = [r.error for r in results if r.error]
                if errors:
                    raise RuntimeError(f"{name}, accept {accept}, {count} streams: {errors[0]}")
                counted = metrics.acceptance(before, after)
                drafts, accepted = counted["drafts"], counted["accepted"]
                tokens_per_step = (
                    1.0 + accepted / drafts if drafts and accepted is not None else 1.0
                )
                figures = run_figures(
                    [r.chunk_times for r in results],
                    [r.chunk_tokens for r in results],
                    tokens_per_step,
                )
                # beside the client's chunk times: the server's decode time (a check)
                figures["server_step_s"] = server_step_s(
                    metrics.delta(before, after, DECODE_TIME + "_sum"),
                    metrics.delta(before, after, DECODE_TIME + "_count"),
                    sum(sum(r.chunk_tokens[1:]) for r in results),
                    tokens_per_step,
                )
                run = {"call": call, "case": name, "accept": accept, "num_spec_tokens": n,
                       "drafts": drafts, "draft_tokens": counted["draft_tokens"],
                       "accepted": accepted, **figures,
                       "completion_tokens": [r.completion_tokens for r in results],
                       # each stream's chunks: ms after its first, tokens carried (the raw data)
                       "chunk_ms": [[round((t - r.chunk_times[0]) * 1e3, 3)
                                     for t in r.chunk_times] for r in results],
                       "chunk_tokens": [r.chunk_tokens for r in results]}  # fmt: skip
                if accept != OWN and abs(tokens_per_step - per_step) > 0.05:
                    # the sampler did not take the setting: the record says so, the model keys
                    # each run on the acceptance the counters measured
                    run["accept_not_as_set"] = (
                        f"{tokens_per_step:.2f} tokens a step, not {per_step}"
                    )
                    say(f"{name} accept {accept}: {run['accept_not_as_set']}")
                runs.append(run)
                say(f"{name} accept {accept}, {count} stream(s): {figures['tokens_per_step']:.2f} "
                    f"tokens a step, step {step_of(figures) * 1e3:.2f} ms "
                    f"(client: {figures['step_s_median'] * 1e3:.2f} ms)")  # fmt: skip
        switch.unlink(missing_ok=True)
    # which runner's sampler took the settings (spec_accept.py says so on its first step)
    server["samplers"] = sorted(set(SAMPLER_LINE.findall(log.read_text(errors="replace"))))
    return runs, server


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        try:
            record = merge([json.loads(p.read_text()) for p in args.merge])
        except (ValueError, KeyError) as error:
            print(f"spec_cost: --merge: {error}", file=sys.stderr)
            return 2
        finish(args.out, record)
        return 0
    began = time.monotonic()
    deadline = began + (args.deadline_s if args.deadline_s is not None else 1e9)
    from sparkserve.knobs.registry import BY_NAME
    from sparkserve.memory.checkpoint import hf_home
    from sparkserve.recipes import RecipeError
    from sparkserve.selftest.models import GeometryError, keep_models, models_home
    from sparkserve.selftest.run import base_env

    name = args.geometry or os.environ.get("RECIPE") or BY_NAME["RECIPE"].default
    try:
        models = keep_models(models_home(hf_home(), name, args.layers), name, args.layers)
    except (GeometryError, RecipeError) as error:
        print(f"spec_cost: {error}", file=sys.stderr)
        return 2
    config = json.loads((models.target / "config.json").read_text())
    work = args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    say(f"{name}: {models.layers} of {models.full_layers} layers, no weights; cases {args.cases}")
    call = {"call": 1, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join([sys.executable, *sys.argv]), "cases": list(args.cases),
            "host": platform.node(), "servers": []}  # fmt: skip
    record: dict[str, Any] = {
        "what": "speculation's step cost, dummy weights; acceptance set per step by "
                "benchmarks/gpu/spec_accept.py (accept k: exactly k drafts a step; all: "
                "tests/cpu_shims' accept-all-drafts; own: vLLM's choice, about 0 on random "
                "weights); step times measured, model_* fields a model (derived.what)",
        "gpu": gpu_name(), "vllm": "unknown",
        "geometry": {"recipe": name, "layers": models.layers,
                     "full_depth_layers": models.full_layers,
                     "config": {k: v for k, v in config.items() if k != "layer_types"}},
        "settings": {"steps": args.steps, "prompt_tokens": PROMPT_TOKENS,
                     "streams": list(args.streams), "warm_steps": WARM_STEPS},
        "published_spark": {"note": PUBLISHED_NOTE, **PUBLISHED_SPARK},
        "calls": [call], "runs": [], "errors": [],
    }  # fmt: skip
    rng = random.Random(52)
    vocab = int(config["vocab_size"])
    status = 0
    for case in args.cases:
        left = deadline - time.monotonic()
        if left < MIN_CASE_S:
            note = f"{case}: not started, {left:.0f} s of the deadline left (a later call)"
            say(note)
            record["errors"].append(note)
            status = 1
            continue
        try:
            runs, server = measure_case(case, args, models, base_env(name), vocab, work, rng, 1,
                                        deadline)  # fmt: skip
        except RuntimeError as error:
            say(str(error))
            record["errors"].append(str(error))
            status = 1
            continue
        record["runs"] += runs
        call["servers"].append(server)
        record["vllm"] = server["vllm"]
        finish(args.out, record)  # what is done so far
    finish(args.out, record)
    return status


if __name__ == "__main__":
    sys.exit(main())
