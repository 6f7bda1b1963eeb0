"""`sparkserve selftest`: the image proved on this machine, before any download.

For the configured recipe (RECIPE, or `--recipe`; `--geometry tiny` for a CPU), models of its
real geometry with no weights (sparkserve.selftest.models) are served by the project's own
launchers, case by case (sparkserve.selftest.cases), with the shipped defaults; each server
gets the same checks (sparkserve.client.checks), then the cases are compared: speculation
against no speculation, the int8 head against the bf16 head, greedy token by token.

Progress goes to stderr while it runs; the end is a table on stdout and `selftest.json` (and
each server's log) in `--out`. Every check ends ok, FAILED, or not tested with the reason.
Exit 0 when every check passed or was not claimed, 1 naming the failed checks, 5 naming the
checks a case claims (its int8 head, its speculation, greedy parity) that were not tested
(no int8 head ran, no draft was proposed, random weights: a divergence cannot be judged), 2
on bad input before anything starts.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from sparkserve import command_line as cl
from sparkserve import recipes
from sparkserve.client import checks
from sparkserve.client.checks import as_json, exit_status, mark, untested_claims
from sparkserve.knobs.registry import BY_NAME, KnobError
from sparkserve.launch.settings import resolve_settings
from sparkserve.memory.checkpoint import hf_home
from sparkserve.output.atomic_file import replace_text
from sparkserve.selftest import cases
from sparkserve.selftest.models import TINY, GeometryError, Models, keep_models, models_home

DEFAULT_LAYERS = 8  # of a recipe's geometry: the drafter reads 8 target layers
START_TIMEOUT_S = 1800  # a cold start on a Spark compiles for minutes


def say(line: str) -> None:
    print(f"selftest: {line}", file=sys.stderr, flush=True)


def serve_case(
    case: cases.Case,
    geometry: str,
    models: Models,
    out: Path,
    start_timeout_s: float,
    cuda: bool,
) -> list[checks.Result]:
    """One start of the case's launcher, its checks, its stop."""
    report_dir = out / f"{case.name}-head"
    shutil.rmtree(report_dir, ignore_errors=True)
    key = secrets.token_hex(12)
    env = cases.case_env(case, models, base_env(geometry), cases.free_port(), key, report_dir)
    try:
        served = resolve_settings(env, case.launcher).values  # as the launcher resolves them
    except (KnobError, recipes.RecipeError) as error:  # the launcher would refuse: no start
        return [checks.Result("healthy", False, f"the launcher would refuse: {error}")]
    running = cases.start(case, env, out / f"{case.name}.log")

    def progress(line: str) -> None:
        say(f"{case.name}: {line}")

    progress(f"{case.script} ({case.why})")
    try:
        healthy = cases.wait_healthy(running, start_timeout_s, progress)
        progress(f"healthy: {'ok' if healthy.ok else 'FAILED'} {healthy.detail}")
        if not healthy.ok:
            return [healthy]
        probe = checks.Probe(
            server=running.server, key=key, model=cases.SERVED_NAME,
            speculative=case.speculative, head_report_dir=report_dir,
            int8_head=case.int8_head, cuda=cuda,
            kept_back=1 if case.launcher == "mtp" else 0,
            metrics_open=served.METRICS_OPEN, server_log=running.log,
            tool_format=model_tool_format(geometry), tool_parser=served.TOOL_PARSER,
        )  # fmt: skip
        max_len = served.MAX_MODEL_LEN
        steps = [
            ("key", lambda: checks.check_key(probe)),
            ("completion", lambda: checks.check_completion(probe)),
            ("chat", lambda: checks.check_chat(probe)),
            ("stream", lambda: checks.check_stream(probe)),
            ("tool call", lambda: checks.check_tool_call(probe)),
            ("tool arguments", lambda: checks.check_tool_arguments(probe)),
            ("reasoning", lambda: checks.check_reasoning(probe)),
            ("prefix hits", lambda: checks.check_prefix_hits(probe, max_len)),
            ("greedy", lambda: checks.greedy_tokens(probe)),
            ("speculation", lambda: checks.check_speculation(probe)),
            ("lm head", lambda: checks.check_head(probe)),
        ]
        if not served.REASONING_PARSER:
            steps = [step for step in steps if step[0] != "reasoning"]
        if not probe.tool_parser:  # TOOL_PARSER= : no tool calls served
            steps = [step for step in steps if not step[0].startswith("tool ")]
        results = [healthy, *checks.run_checks(probe, steps, progress)]
        stopped = cases.stop_with_a_stream_open(running, served.SHUTDOWN_TIMEOUT_S, max_len)
        progress(f"{stopped.name}: {mark(stopped.ok)} {stopped.detail}")
        return [*results, stopped]
    finally:
        cases.kill(running)


def base_env(geometry: str) -> dict[str, str]:
    """The user's environment (compose's), with the geometry's recipe unless it is the tiny
    model's."""
    return dict(os.environ, **({} if geometry == TINY else {"RECIPE": geometry}))


def model_tool_format(geometry: str) -> str:
    """The tool-call format the served model writes, as the parser its recipe names (the
    registry's default, Qwen3.5's, for the tiny geometry): what the tool-call check has the
    model write, whatever TOOL_PARSER the server runs."""
    if geometry == TINY:
        return BY_NAME["TOOL_PARSER"].default
    return recipes.load(geometry).shared.get("TOOL_PARSER", BY_NAME["TOOL_PARSER"].default)


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def compare(results: dict[str, list[checks.Result]]) -> dict[str, checks.Result]:
    """Greedy parity across the cases that ran: speculation against `plain`, `plain`'s int8
    head against `bf16`'s."""
    greedy = {
        name: next((r.data["runs"] for r in rs if r.name == "greedy" and r.ok), None)
        for name, rs in results.items()
    }
    pairs = [("dflash", "plain"), ("mtp", "plain"), ("plain", "bf16")]
    out = {}
    for case, reference in pairs:
        if greedy.get(case) and greedy.get(reference):
            name = f"greedy vs {reference}"
            out[case] = checks.compare_greedy(name, greedy[case], greedy[reference])
    return out


def failed_checks(results: dict[str, list[checks.Result]]) -> list[str]:
    """`case: check` for each check that failed (a reported one is not a failure)."""
    return [f"{case}: {r.name}" for case, rs in results.items() for r in rs if r.ok is False]


def table(results: dict[str, list[checks.Result]]) -> str:
    rows = ["| case | check | result | detail |", "| --- | --- | --- | --- |"]
    for case, case_results in results.items():
        for result in case_results:
            rows.append(f"| {case} | {result.name} | {mark(result.ok)} | {result.detail} |")
    return "\n".join(rows)


def add_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "selftest",
        help="serve models of the recipe's geometry (no weights) through the launchers and "
        "check every path",
        description=(__doc__ or "").split("\n\n")[1],
    )
    parser.add_argument("--recipe", help=f"a recipe's geometry (default: RECIPE), or {TINY!r}")
    parser.add_argument(
        "--cases", default=",".join(cases.CASES),
        help=f"comma-separated, in order, from {', '.join(cases.CASES)} (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--layers", type=int,
        help=f"target layers kept (default: {DEFAULT_LAYERS} of a recipe's, all of {TINY!r})",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="where the table, JSON and logs go "
                        "(default: HF_HOME/sparkserve/selftest/<time>)")  # fmt: skip
    parser.add_argument("--start-timeout-s", type=float, default=START_TIMEOUT_S)
    parser.set_defaults(run=run)


def chosen_geometry(args: argparse.Namespace) -> str:
    name = args.recipe or os.environ.get("RECIPE") or BY_NAME["RECIPE"].default
    if name != TINY:
        recipes.load(name)  # RecipeError names the value and the recipes there are
    return name


def run(args: argparse.Namespace) -> int:
    try:
        names = [n.strip() for n in args.cases.split(",") if n.strip()]
        if not names or (bad := [n for n in names if n not in cases.CASES]):
            bad = bad if names else [args.cases]
            raise GeometryError(f"--cases: {bad[0]!r} is not one of {', '.join(cases.CASES)}")
        geometry = chosen_geometry(args)
        layers = args.layers or (None if geometry == TINY else DEFAULT_LAYERS)
        home = hf_home()
        models = keep_models(models_home(home, geometry, layers), geometry, layers)
    except (GeometryError, recipes.RecipeError) as error:
        print(f"sparkserve selftest: {error}", file=sys.stderr)
        return 2
    if models.drafter is None:
        names = [n for n in names if n != "dflash"]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or home / "sparkserve" / "selftest" / stamp
    out.mkdir(parents=True, exist_ok=True)
    say(f"{geometry}: {models.layers} of {models.full_layers} layers, vocab {models.vocab}, "
        f"no weights; cases {', '.join(names)}; out {out}")  # fmt: skip
    results: dict[str, list[checks.Result]] = {}
    cuda = has_cuda()
    for name in names:
        results[name] = serve_case(
            cases.CASES[name], geometry, models, out, args.start_timeout_s, cuda
        )
        write_json(out, geometry, models, cuda, results)
    for case, result in compare(results).items():
        results[case].append(result)
        say(f"{case}: {result.name}: {mark(result.ok)} {result.detail}")
    write_json(out, geometry, models, cuda, results)
    print(table(results))
    failed = failed_checks(results)
    if failed:
        print(f"sparkserve selftest: FAILED: {'; '.join(failed)} (logs in {out})", file=sys.stderr)
        return cl.EXIT_FAILED
    untested = untested_claims((case, r) for case, rs in results.items() for r in rs)
    if untested:
        print(f"sparkserve selftest: not tested: {'; '.join(untested)}, which the case claims "
              f"(logs in {out})", file=sys.stderr)  # fmt: skip
        return cl.EXIT_NOT_TESTED
    cases_run = f"{len(results)} case{'s' if len(results) != 1 else ''}"
    print(f"sparkserve selftest: passed ({cases_run}; {out}/selftest.json)")
    return 0


def write_json(out: Path, geometry: str, models: Models, cuda: bool, results: dict) -> None:
    document = {
        "geometry": geometry, "layers": models.layers, "full_layers": models.full_layers,
        "vocab": models.vocab, "cuda": cuda,
        "cases": {case: [as_json(r) for r in rs] for case, rs in results.items()},
        "failed": failed_checks(results),
        "not_tested": untested_claims((c, r) for c, rs in results.items() for r in rs),
        "outcome": {cl.EXIT_OK: "passed", cl.EXIT_FAILED: "FAILED"}.get(
            exit_status(r for rs in results.values() for r in rs), "not tested"),
    }  # fmt: skip
    replace_text(out / "selftest.json", json.dumps(document, indent=1, default=str))
