"""`sparkserve verify`: prove on this machine that what sparkserve changes in the model (the
int8 lm-head) and in its decoding (DFlash or MTP speculation, prefix caching) left its output
as the plain model's, and that the API answers as clients expect.

The running server is restarted through compose (`--driver compose`) or its launcher
(`--driver launcher --pid-file F`) with each reference setting: prefix caching off, the bf16
head, no speculation. A fixed, versioned prompt set (chat, code, tool use, a long shared
prefix) is sent as token ids, greedy, to each (docs/VERIFY.md). The server is left running
with its starting setting, also when interrupted.

Each check ends passed, FAILED, or not tested with the reason ("no int8 head ran": the int8
head's setting gave prompt log-probabilities bit-identical to the bf16 head's; "no draft was
proposed": vLLM's spec-decode counters did not move over the speculating runs). The settings
claim what they turn on (the int8 head, speculation, prefix caching) and --checks claims what
it names.

Exit status: 0 every claimed check was tested and passed, 1 a check failed (named on stderr),
5 nothing failed but a claimed check was not tested (named on stderr), 2 bad input or a server
that is not sparkserve's (nothing restarted), 3 a restart broke off, 130 interrupted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from sparkserve import __version__, recipes
from sparkserve import command_line as cl
from sparkserve.client.checks import (
    Result,
    as_json,
    exit_status,
    not_tested,
    run_checks,
    untested_claims,
)
from sparkserve.client.server import Server, ServerError
from sparkserve.client.tool import say, write_report
from sparkserve.recipes import RecipeError
from sparkserve.server.driver import RestartFailed
from sparkserve.server.driver_options import (
    add_restart_options,
    guarded,
    prepare,
)
from sparkserve.server.restarts import Interrupted, Restarter
from sparkserve.verify import api, collect, compare, phases, report
from sparkserve.verify.prompts import VERSION

PROG = "sparkserve verify"
DEFAULT_CHECKS = ",".join(phases.CHECKS)


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "verify",
        help="check the int8 head, speculation and prefix caching against the plain model by "
        "restarting the server with each",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_restart_options(parser, PROG)
    parser.add_argument(
        "--checks", default=DEFAULT_CHECKS,
        help=f"which, comma-separated (default all: {','.join(phases.CHECKS)})",
    )  # fmt: skip
    parser.add_argument(
        "--gen-tokens", type=cl.ranged(int, "--gen-tokens", 4, 4096), default=64,
        help="greedy tokens per prompt (64)",
    )  # fmt: skip
    parser.add_argument(
        "--head-max-delta", type=cl.ranged(float, "--head-max-delta", 0.0),
        help="the int8 head's largest |delta logprob| (default: the recipe's)",
    )  # fmt: skip
    parser.add_argument(
        "--numeric-tie", type=cl.ranged(float, "--numeric-tie", 0.0),
        help="log-probabilities closer than this are a tie (default: the recipe's)",
    )  # fmt: skip
    parser.set_defaults(run=run)


def _checks(text: str) -> set[str]:
    chosen = {c.strip() for c in text.split(",") if c.strip()}
    unknown = sorted(chosen - set(phases.CHECKS))
    if not chosen or unknown:
        bad = unknown[0] if unknown else text
        raise cl.UsageError(f"bad --checks {bad!r}: one or more of {','.join(phases.CHECKS)}")
    return chosen


@dataclass
class Collected:
    """What each phase read: greedy runs by setting and prompt, teacher-forced scores by the
    setting they score, and the served setting's repeat of the shared prefix."""

    runs: dict[str, dict[str, collect.Run]] = field(default_factory=dict)
    scores: dict[str, dict[str, list[collect.Score]]] = field(default_factory=dict)
    # the bf16 head's teacher-forced scores of its own runs: the int8 head's reference
    bf16_scores: dict[str, list[collect.Score]] = field(default_factory=dict)
    repeat: dict[str, collect.Run] = field(default_factory=dict)
    repeat_hits: float = 0.0
    # the spec-decode counters over the served greedy runs
    spec: collect.SpecCounts = field(default_factory=lambda: collect.SpecCounts(0.0, 0.0))
    # the head's output on a fixed prompt in the bf16 head's and the int8 head's settings
    head_probes: dict[str, collect.HeadProbe] = field(default_factory=dict)


def _greedy_all(server: Server, model: str, prompts: list[collect.Rendered],
                gen: int) -> dict[str, collect.Run]:  # fmt: skip
    return {p.prompt.name: collect.greedy(server, model, p, gen) for p in prompts}


def _serve_phase(phase: phases.Phase, server: Server, model: str, prompts: list[collect.Rendered],
                 args: argparse.Namespace, got: Collected, uses: phases.Uses,
                 checks: set[str]) -> None:  # fmt: skip
    def runs() -> None:
        got.runs[phase.name] = _greedy_all(server, model, prompts, args.gen_tokens)

    if phase.name == phases.SERVED and "speculation" in checks and uses.speculating:
        got.spec = collect.spec_counts(server, model, runs)  # the runs speculation is judged on
        say(f"[verify] served: {got.spec.drafts:.0f} drafts, {got.spec.accepted:.0f} tokens "
            "accepted (vLLM's spec-decode counters)")  # fmt: skip
    else:
        runs()
    say(f"[verify] {phase.name}: {len(prompts)} prompts x {args.gen_tokens} greedy tokens")
    if phase.name in (phases.BF16, phases.PLAIN) and "head" in checks and uses.int8_head:
        got.head_probes[phase.name] = collect.head_probe(server, model, prompts[0])
    if phase.name == phases.BF16:
        got.bf16_scores = _score_all(server, model, prompts, got.runs[phases.BF16])
        say(f"[verify] {phase.name}: scored its own runs (teacher-forced)")
    if phase.name == phases.SERVED and "prefix" in checks and uses.prefix_cache:
        shared = [p for p in prompts if p.prompt.shared_prefix]

        def again() -> None:
            got.repeat.update(_greedy_all(server, model, shared, args.gen_tokens))

        got.repeat_hits = collect.prefix_hits(server, again)
        say(f"[verify] served: the shared prefix again, {got.repeat_hits:.0f} tokens hit")
    if phase.name == phases.PLAIN:
        for reference in (phases.SERVED, phases.BF16):
            if reference == phases.SERVED and not ("speculation" in checks and uses.speculating):
                continue
            if reference not in got.runs:
                continue
            got.scores[reference] = _score_all(server, model, prompts, got.runs[reference])
            say(f"[verify] {phase.name}: scored the {reference} runs (teacher-forced)")


def _score_all(server: Server, model: str, prompts: list[collect.Rendered],
               runs: dict[str, collect.Run]) -> dict[str, list[collect.Score]]:  # fmt: skip
    by_name = {p.prompt.name: p for p in prompts}
    return {name: collect.score(server, model, by_name[name], run) for name, run in runs.items()}


def _unused(name: str, knob: str, claimed: bool) -> tuple[str, Result]:
    """A feature the settings turn off: not tested; a claim where --checks named it."""
    why = f"{knob}: the feature is off" + (" but --checks names it" if claimed else "")
    return phases.SERVED, not_tested(name, why, claimed=claimed)


def _verdicts(
    got: Collected,
    uses: phases.Uses,
    checks: set[str],
    max_delta: float,
    tie: float,
    named: frozenset[str] = frozenset(),
) -> list[tuple[str, Result]]:
    """The comparisons' results; `named`: the checks --checks named (claims of their own)."""
    found: list[tuple[str, Result]] = []
    served_runs = got.runs[phases.SERVED]
    if "prefix" in checks and not uses.prefix_cache:
        found.append(_unused("prefix caching vs off", "PREFIX_CACHE=0", "prefix" in named))
    elif "prefix" in checks:
        first = {name: served_runs[name] for name in got.repeat}
        repeated = compare.same_runs("repeat", got.repeat, first, tie)
        off = compare.same_runs("cache off", served_runs, got.runs[phases.PREFIX_OFF], tie)
        verdict = compare.prefix_caching(got.repeat_hits, repeated, off)
        found.append((phases.PREFIX_OFF, verdict))
    if "speculation" in checks and not uses.speculating:
        found.append(_unused("speculation vs plain", "NUM_SPEC_TOKENS=0", "speculation" in named))
    elif "speculation" in checks:
        plain = got.runs[phases.PLAIN]
        verdict = compare.speculation(served_runs, plain, got.scores[phases.SERVED], tie, got.spec)
        found.append((phases.PLAIN, verdict))
    if "head" in checks and not uses.int8_head:
        found.append(_unused("int8 head vs bf16", "SPARK_KEEP_BF16_LMHEAD=1", "head" in named))
    elif "head" in checks:
        probes = (got.head_probes.get(phases.BF16), got.head_probes.get(phases.PLAIN))
        verdict = compare.int8_head(got.bf16_scores, got.scores[phases.BF16], max_delta, probes)
        found.append((phases.BF16, verdict))
    return found


def _limits(args: argparse.Namespace, recipe_name: str) -> tuple[float, float, str]:
    try:
        limits = recipes.load(recipe_name).verify
        source = f"recipe {recipe_name}"
    except RecipeError:
        limits, source = recipes.VerifyLimits(), "the default limits"
    max_delta = limits.head_max_delta if args.head_max_delta is None else args.head_max_delta
    tie = limits.numeric_tie if args.numeric_tie is None else args.numeric_tie
    return max_delta, tie, source


def _verify(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    checks = _checks(args.checks)
    named = frozenset(checks) if args.checks != DEFAULT_CHECKS else frozenset()
    server, info, out, driver, served = prepare(args, env, "verify", "verify")
    uses = phases.Uses.of(served)
    max_delta, tie, limits_source = _limits(args, served.values.RECIPE)
    plan = phases.plan(uses, checks)
    max_len = info.max_model_len or served.values.MAX_MODEL_LEN
    say(f"[verify] {info.model} at {server.url}: speculation {'on' if uses.speculating else 'off'}"
        f", {'int8' if uses.int8_head else 'bf16'} head, prefix caching "
        f"{'on' if uses.prefix_cache else 'off'}; settings {', '.join(p.name for p in plan)}; "
        f"{phases.restarts_line(plan)}; prompt set {VERSION}")  # fmt: skip
    prompts = collect.render(server, info.model, max_len, args.gen_tokens)
    started_at = dt.datetime.now(dt.UTC)
    restarter = Restarter.of(driver, phases.TOUCHED, args.healthy_timeout_s, say, "verify")
    got = Collected()
    results: list[tuple[str, Result]] = []
    status = cl.EXIT_OK
    try:
        for phase in plan:
            restarter.serve(phase.changes, f"{phase.name}: {phase.why}")
            if phase.name == phases.SERVED and "api" in checks:
                probe = api.probe_for(server, info.model, served, out)
                steps = api.steps(probe, served, max_len)
                found = run_checks(probe, steps, lambda line: say(f"[verify] api: {line}"))
                results += [(phase.name, r) for r in [*found, *api.skipped(probe, served)]]
            _serve_phase(phase, server, info.model, prompts, args, got, uses, checks)
        results += _verdicts(got, uses, checks, max_delta, tie, named)
    except (ServerError, RestartFailed, KeyError, IndexError, TypeError, ValueError) as exc:
        results.append(("", Result("run", False, f"{type(exc).__name__}: {exc}"[:300])))
        status = cl.EXIT_STOPPED
    except Interrupted as exc:
        results.append(("", Result("run", False, f"interrupted ({exc})")))
        status = cl.EXIT_INTERRUPTED
    finally:
        restarter.restore()
    document = {
        "tool": PROG, "version": __version__, "prompt_set": VERSION,
        "started_at": started_at.isoformat(timespec="seconds"), "url": server.url,
        "model": info.model, "driver": args.driver, "launcher": served.launcher,
        "image": served.image, "recipe": served.values.RECIPE, "vllm": server.vllm_version(),
        "uses": asdict(uses), "settings": [asdict(p) for p in plan],
        "gen_tokens": args.gen_tokens, "head_max_delta": max_delta, "numeric_tie": tie,
        "limits": limits_source, "restart_s": restarter.took_s,
        "prompts": {p.prompt.name: {"kind": p.prompt.kind, "tokens": len(p.ids)}
                    for p in prompts},
        "results": [{"setting": phase, **as_json(r)} for phase, r in results],
        "runs": {phase: {name: asdict(run) for name, run in runs.items()}
                 for phase, runs in got.runs.items()},
        "failed": report.failed(results),
        "not_tested": untested_claims(results),
        "outcome": {cl.EXIT_OK: "passed", cl.EXIT_FAILED: "FAILED"}.get(
            exit_status(r for _, r in results), "not tested"),
        "files": {"json": "verify.json", "png": "verify.png"},
    }  # fmt: skip
    write_report(out, "verify", document, report.plot, "verify")
    print(report.table(results))
    if status == cl.EXIT_INTERRUPTED:
        say(f"[verify] {results[-1][1].detail}: the starting setting is back")
        return status
    if status != cl.EXIT_OK:
        return cl.fail(PROG, results[-1][1].detail, status)
    if document["failed"]:
        print(f"{PROG}: FAILED: {', '.join(document['failed'])} ({out}/verify.json)",
              file=sys.stderr)  # fmt: skip
        return cl.EXIT_FAILED
    if document["not_tested"]:
        print(f"{PROG}: not tested: {', '.join(document['not_tested'])}, which the settings "
              f"claim ({out}/verify.json)", file=sys.stderr)  # fmt: skip
        return cl.EXIT_NOT_TESTED
    print(f"{PROG}: passed ({out}/verify.json)", file=sys.stderr)
    return cl.EXIT_OK


run = guarded(PROG, "verify", _verify)
