"""`sparkserve recipes`: the recipes with what `sparkserve plan` says about each on a Spark.

    sparkserve recipes [--json]        every recipe and launcher: weights, KV pool, concurrency
                                       at the recipe's context, memory left to the OS, verdict
    sparkserve recipes show NAME       the knobs a launcher resolves for it (--launcher)
    sparkserve recipes sync [--check]  the README's recipes table

Exit status: 0 all fit (or shown, or in sync); 1 one does not fit (or the table drifted);
2 a bad recipe or option (one line); 3 vLLM is not importable (the plan needs it).

A command module, above the recipes package: `show` prints the launcher's own resolution
(sparkserve.launch.settings), which reads the recipes; the package itself imports neither.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from sparkserve import recipes
from sparkserve.command_line import UsageError, one_line_errors
from sparkserve.knobs.registry import LAUNCHERS, SECRETS, KnobError, Launcher
from sparkserve.launch.settings import resolve_settings
from sparkserve.launch.shell import shell_quote
from sparkserve.memory.checkpoint import CheckpointError
from sparkserve.plan.recipe_summary import Summary, summarise
from sparkserve.plan.single import SPARK_MEM_TOTAL_GIB
from sparkserve.recipes import readme

PROG = "sparkserve recipes"
EXIT_OK, EXIT_DOES_NOT_FIT, EXIT_BAD, EXIT_NO_VLLM = 0, 1, 2, 3
REPO = Path(__file__).resolve().parents[3]


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "recipes", help="tested models: list them with the plan on a Spark, show one, sync docs",
        description=__doc__.splitlines()[0],
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="one JSON list instead of the table")
    parser.add_argument(
        "--mem-total-gib", type=float, default=SPARK_MEM_TOTAL_GIB,
        help=f"the machine's memory for the plan (default: a Spark's {SPARK_MEM_TOTAL_GIB})",
    )  # fmt: skip
    parser.add_argument(
        "--os-reserve-gb", default="14", help="GiB the plan must leave to the OS (default 14)"
    )
    actions = parser.add_subparsers(dest="recipes_command", metavar="ACTION")
    show = actions.add_parser("show", help="the knobs a launcher resolves for one recipe")
    show.add_argument("name")
    show.add_argument("--launcher", choices=LAUNCHERS, help="default: the recipe's first")
    sync = actions.add_parser("sync", help="regenerate the README's recipes table")
    sync.add_argument("--check", action="store_true", help="only report drift (exit 1)")
    sync.add_argument("--repo", type=Path, default=REPO, help="the checkout to update")
    for each in (parser, show, sync):
        one_line_errors(each, PROG)
    parser.set_defaults(run=run)


def _show(name: str, launcher: Launcher | None) -> int:
    recipe = recipes.load(name)
    chosen: Launcher = launcher or recipe.launchers[0]
    # The launcher's own resolution of this environment with RECIPE=name.
    settings = resolve_settings(os.environ, chosen, given={"RECIPE": name})
    print(f"# {recipe.title} ({recipe.path}); launcher {recipes.LAUNCHER_SCRIPTS[chosen]}")
    for source in recipe.sources:
        print(f"# source: {source}")
    if recipe.notes:
        print(f"# note: {recipe.notes}")
    for knob, value in settings.text.items():
        if knob not in SECRETS:
            print(f"export {knob}={shell_quote(value)}  # {settings.layer[knob]}")
    return EXIT_OK


def _table(summaries: list[Summary]) -> str:
    header = ("recipe", "launcher", "weights", "KV", "KV pool", "concurrency", "OS left", "")
    rows = [header]
    for s in summaries:
        pool = f"{s.pool_tokens:,} tok" if s.pool_tokens is not None else "-"
        concurrency = (
            f"{s.concurrency:.2f}x @ {s.knobs.get('MAX_MODEL_LEN', '?')}"
            if s.concurrency is not None
            else "-"
        )
        rows.append(
            (
                s.recipe, recipes.LAUNCHER_SCRIPTS[s.launcher], f"{s.weights_gib:.1f} GiB",
                f"{s.kv_gib:.1f} GiB", pool, concurrency, f"{s.os_left_gib:.1f} GiB", s.verdict,
            )
        )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _list(args: argparse.Namespace) -> int:
    summaries = [
        summarise(recipe, launcher, args.mem_total_gib, args.os_reserve_gb)
        for recipe in recipes.load_all()
        for launcher in recipe.launchers
    ]
    if args.json:
        print(json.dumps([s.as_json() for s in summaries], indent=1))
    else:
        print(_table(summaries))
    unknown = [s.verdict for s in summaries if s.verdict.startswith("unknown")]
    if unknown:
        print(f"{PROG}: {unknown[0]}", file=sys.stderr)
        return EXIT_NO_VLLM
    return EXIT_OK if all(s.fits for s in summaries) else EXIT_DOES_NOT_FIT


def run(args: argparse.Namespace) -> int:
    try:
        if args.recipes_command == "show":
            return _show(args.name, args.launcher)
        if args.recipes_command == "sync":
            drifted = readme.sync(args.repo, recipes.load_all(), check=args.check)
            if drifted:
                print(f"{'out of date' if args.check else 'updated'}: {readme.TARGET}")
            return EXIT_DOES_NOT_FIT if drifted and args.check else EXIT_OK
        return _list(args)
    except (KnobError, CheckpointError, UsageError) as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return EXIT_BAD
