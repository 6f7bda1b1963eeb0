"""What `sparkserve plan` says about a recipe on a Spark, from the recipe's shipped geometry.

The plan runs exactly as `sparkserve plan` would with the recipe's knobs as options: its own
parser (`plan_cli.add_command`) reads them, `plan.make_plan` computes the KV cache with vLLM's
classes. Nothing is downloaded: the weights are the recipe's `weights_gib`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from sparkserve.knobs.registry import BY_NAME, Launcher
from sparkserve.memory.host import GIB
from sparkserve.plan import cli as plan_cli
from sparkserve.plan import single as plan
from sparkserve.recipes import Recipe

# The plan options a recipe's knobs feed, by knob.
PLAN_OPTIONS = {
    "NUM_SPEC_TOKENS": "--num-spec-tokens",
    "GPU_MEM": "--gpu-mem",
    "MAX_MODEL_LEN": "--max-model-len",
    "MAX_NUM_SEQS": "--max-num-seqs",
    "MAX_BATCHED_TOKENS": "--max-batched-tokens",
    "PREFIX_CACHE": "--prefix-cache",
}


@dataclass(frozen=True)
class Summary:
    recipe: str
    launcher: str
    knobs: dict[str, str]
    weights_gib: float
    kv_gib: float
    pool_tokens: int | None
    concurrency: float | None
    os_left_gib: float
    fits: bool
    verdict: str  # "fits", "unknown: ..." or "does not fit: ..."

    def as_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _value(recipe: Recipe, launcher: Launcher, name: str) -> str:
    return recipe.knobs_for(launcher).get(name, BY_NAME[name].default_for(launcher))


def plan_argv(
    recipe: Recipe, launcher: Launcher, mem_total_gib: float, os_reserve_gb: str
) -> list[str]:
    argv = ["plan", "--model", str(recipe.geometry), "--method", launcher]
    argv += ["--weights-gib", str(recipe.weights_gib), "--mem-total-gib", str(mem_total_gib)]
    argv += ["--os-reserve-gb", os_reserve_gb]
    for name, option in PLAN_OPTIONS.items():
        argv += [option, _value(recipe, launcher, name)]
    if launcher == "dflash":
        argv += ["--drafter", str(recipe.drafter_geometry)]
        argv += ["--drafter-weights-gib", str(recipe.drafter_weights_gib)]
    return argv


def plan_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sparkserve")
    plan_cli.add_command(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def summarise(
    recipe: Recipe, launcher: Launcher, mem_total_gib: float, os_reserve_gb: str
) -> Summary:
    args = plan_args(plan_argv(recipe, launcher, mem_total_gib, os_reserve_gb))
    result = plan.make_plan(args, {})
    kv = result.kv
    if result.fits:
        verdict = "fits"
    elif kv is None and not result.problems:
        verdict = f"unknown: {result.kv_error}"
    else:
        verdict = "does not fit: " + "; ".join(result.problems)
    return Summary(
        recipe=recipe.name,
        launcher=launcher,
        knobs=recipe.knobs_for(launcher),
        weights_gib=(result.weights_bytes + result.drafter_weights_bytes) / GIB,
        kv_gib=result.kv_bytes / GIB,
        pool_tokens=kv.pool_tokens if kv else None,
        concurrency=kv.max_concurrency if kv else None,
        os_left_gib=result.os_left_bytes / GIB,
        fits=result.fits,
        verdict=verdict,
    )
