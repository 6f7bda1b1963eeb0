"""Every knob's value at start-up, resolved once, in one order, typed.

A knob's value comes from the highest layer that has one (docs/KNOBS.md, "Where a value comes
from"):

1. the registry's default (knobs/registry.py);
2. the image's default (the cpu image's, where the knob declares one);
3. the launcher's default (mtp_serve.sh's, where the knob declares one);
4. the recipe's value, when the user picked a RECIPE (recipes/NAME.toml);
5. what the user set: the environment (compose passes only what `.env`, the shell or an edited
   compose line sets), or an option of a tool (plan's --gpu-mem ...).

"Set" means present: a knob set to a value equal to some default is set, and wins over a
recipe. An empty value counts as set only where the knob allows empty (TOOL_PARSER= turns the
parser off); elsewhere it reads as unset.

Everything derived from the knobs lives here once: whether the launcher drafts tokens, the KV
cache in bytes, vLLM's share of memory in bytes, the rows the lm-head serves at most.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sparkserve import recipes
from sparkserve.knobs.registry import (
    BY_NAME,
    IMAGE_ENV,
    Image,
    Knob,
    KnobError,
    Launcher,
    image_of,
    knobs_for,
)
from sparkserve.knobs.values import KnobValues
from sparkserve.memory.budget import budget_problem, share_bytes
from sparkserve.memory.host import GIB

Layer = Literal["registry", "image", "launcher", "recipe", "user", "option"]
LAYERS: tuple[Layer, ...] = ("registry", "image", "launcher", "recipe", "user", "option")


def decode_rows(max_num_seqs: int, num_spec_tokens: int) -> int:
    """Rows one call of the lm-head gets at most while decoding: each running request scores
    its drafted tokens and one more."""
    return max_num_seqs * (max(num_spec_tokens, 0) + 1)


def is_set(knob: Knob, raw: str | None) -> bool:
    """Whether a value given for `knob` counts as set (see the module docstring)."""
    return raw is not None and (raw.strip() != "" or knob.empty_ok)


@dataclass(frozen=True)
class Settings:
    """The resolved knobs of one launcher: `values` typed (parsed once, here), the one way
    logic reads a knob; `text` each value as vLLM and the shell get it (validated, in its
    plain form), read only where an argv, an environment or a message is built
    (tests/codebase/test_knob_reads.py lists where); `layer` where each came from."""

    launcher: Launcher
    image: Image
    text: Mapping[str, str]
    layer: Mapping[str, Layer]
    recipe: recipes.Recipe | None
    values: KnobValues

    @property
    def speculating(self) -> bool:
        """The launcher passes vLLM a speculative config (NUM_SPEC_TOKENS > 0)."""
        return self.values.NUM_SPEC_TOKENS > 0

    @property
    def pair(self) -> bool:
        return self.values.CLUSTER_NODES == 2

    @property
    def kv_cache_bytes(self) -> int | None:
        """KV_CACHE_GB in bytes (vLLM's --kv-cache-memory-bytes); None lets GPU_MEM decide."""
        gib = self.values.KV_CACHE_GB
        return None if gib is None else int(gib * GIB)

    @property
    def lmhead_rows(self) -> int:
        return decode_rows(self.values.MAX_NUM_SEQS, self.values.NUM_SPEC_TOKENS)

    def vllm_share_bytes(self, total_bytes: int) -> int:
        """GPU_MEM of this machine's memory: what vLLM may take."""
        return share_bytes(self.values.GPU_MEM, total_bytes)

    def budget_problem(self, total_bytes: int) -> str | None:
        """Why GPU_MEM leaves the OS less than OS_RESERVE_GB here (one line), or None."""
        return budget_problem(self.values.GPU_MEM, self.values.OS_RESERVE_GB, total_bytes)

    def models(self) -> list[tuple[str, str]]:
        """(knob, checkpoint) of every model vLLM will load: the target, and the drafter
        when DFlash drafts."""
        wanted = [("MODEL", self.values.MODEL)]
        if self.launcher == "dflash" and self.speculating:
            wanted.append(("DRAFT_MODEL", self.values.DRAFT_MODEL or ""))
        return wanted


def _chosen_recipe(
    env: Mapping[str, str], given: Mapping[str, str], launcher: Launcher | None
) -> recipes.Recipe | None:
    """The recipe the user picked, if any; RecipeError when it cannot serve with `launcher`."""
    knob = BY_NAME["RECIPE"]
    raw = given.get("RECIPE", env.get("RECIPE"))
    if not is_set(knob, raw):
        return None
    recipe = recipes.load(knob.check(str(raw)), env)
    if launcher is not None and launcher not in recipe.launchers:
        scripts = " or ".join(recipes.LAUNCHER_SCRIPTS[item] for item in recipe.launchers)
        raise recipes.RecipeError(
            f"RECIPE={recipe.name}: serves with {scripts}, not "
            f"{recipes.LAUNCHER_SCRIPTS[launcher]} ({launcher}); start {scripts} "
            "(compose: the profile of that launcher)"
        )
    return recipe


def resolve_settings(
    env: Mapping[str, str] | None = None,
    launcher: Launcher = "dflash",
    given: Mapping[str, str] | None = None,
) -> Settings:
    """The launcher's knobs from `env` (default: this process's environment) and a tool's
    options (`given`, highest); KnobError (one line) on a bad value or recipe."""
    env = os.environ if env is None else env
    given = given or {}
    image = image_of(env)
    recipe = _chosen_recipe(env, given, launcher)
    from_recipe = recipe.knobs_for(launcher) if recipe is not None else {}
    text: dict[str, str] = {}
    layer: dict[str, Layer] = {}
    source: Layer
    for knob in knobs_for(launcher):
        raw, source = knob.default_source(launcher, image)
        if knob.name in from_recipe:
            raw, source = from_recipe[knob.name], "recipe"
        if is_set(knob, env.get(knob.name)):
            raw, source = env[knob.name], "user"
        if is_set(knob, given.get(knob.name)):
            raw, source = given[knob.name], "option"
        text[knob.name] = knob.check(raw)
        layer[knob.name] = source
    check_exposure(text)
    return Settings(launcher, image, text, layer, recipe, KnobValues.parse(text))


def is_loopback(address: str) -> bool:
    """Whether an address (or name) is reachable from this machine only."""
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it resolves to whatever it resolves to


def check_exposure(text: Mapping[str, str]) -> None:
    """An API published beyond loopback needs API_KEY (KnobError, one line). A pair's worker
    serves no API (headless): nothing to guard there."""
    bind = text["BIND_ADDRESS"]
    worker = text["CLUSTER_NODES"] == "2" and text["CLUSTER_RANK"] == "1"
    if not is_loopback(bind) and not text["API_KEY"] and not worker:
        raise KnobError(
            f"BIND_ADDRESS={bind!r} publishes the API beyond this machine without API_KEY: set "
            "API_KEY (every client then sends it), or BIND_ADDRESS=127.0.0.1"
        )


def check_host_bind(settings: Settings, env: Mapping[str, str]) -> None:
    """A launcher run on a host (no image set SPARKSERVE_IMAGE) binds HOST itself: no container
    keeps it behind BIND_ADDRESS, so a HOST beyond loopback needs API_KEY too (KnobError)."""
    worker = settings.values.CLUSTER_NODES == 2 and settings.values.CLUSTER_RANK == 1
    if IMAGE_ENV in env or worker:
        return
    host = settings.values.HOST
    if not is_loopback(host) and not settings.values.API_KEY:
        raise KnobError(
            f"HOST={host!r} binds the API beyond this machine without API_KEY (a run on the "
            "host, not in a container): set HOST=127.0.0.1, or API_KEY"
        )


def check_recipe_fits(settings: Settings, total_bytes: int) -> None:
    """A recipe the user picked, serving its own model, must leave room for a KV cache in
    GPU_MEM of this machine (RecipeError, one line)."""
    if settings.recipe is None or settings.layer["MODEL"] != "recipe":
        return
    settings.recipe.check_fits(settings.launcher, settings.vllm_share_bytes(total_bytes))


def check_budget(settings: Settings, total_bytes: int) -> None:
    problem = settings.budget_problem(total_bytes)
    if problem is not None:
        raise KnobError(problem)


def tool_settings(env: Mapping[str, str], given: Mapping[str, str] | None = None) -> Settings:
    """The settings a host tool (stress, bench) judges a running server by: those of the
    chosen recipe's first launcher, else serve.sh's."""
    recipe = _chosen_recipe(env, given or {}, None)
    launcher = recipe.launchers[0] if recipe is not None else "dflash"
    return resolve_settings(env, launcher, given)
