"""Recipes: a tested set of knob values for one model, kept as data under recipes/.

A recipe is `recipes/NAME.toml` plus the model's config.json (geometry only, no weights) in
`recipes/NAME/config.json` and, for a DFlash drafter, `recipes/NAME/drafter/config.json`; the
checks (vLLM's parser and engine config, `sparkserve plan`) run on those files offline. The
RECIPE knob picks one; sparkserve.launch.settings puts its values above the defaults and below what
the user set. A recipe the user picked is refused before start when its weights leave no KV
memory in GPU_MEM of this machine (unless the user set MODEL, or for a dry run).

Rules a recipe file must follow (any break is one line naming the file and the problem):
- `title`, `launchers` (the launchers it serves with, the recommended first), `weights_gib`
  (the target checkpoint's size, the figure the pre-start fit check uses), `sources` (public
  pages for every id and figure); `drafter_weights_gib` when it serves with DFlash;
- `[knobs]`: registry knobs of the model and memory groups, and `[knobs.LAUNCHER]` tables for
  values that differ by launcher; every value passes the registry's own check.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkserve.knobs.registry import BY_NAME, LAUNCHER_SCRIPTS, LAUNCHERS, KnobError, Launcher
from sparkserve.memory.budget import DEFAULT_OVERHEAD_GIB, fit_problem
from sparkserve.memory.host import GIB

CHECKOUT_DIR = Path(__file__).resolve().parents[3] / "recipes"
IMAGE_DIR = Path("/opt/sparkserve/recipes")  # the Dockerfile copies recipes/ here
# "serve.sh (dflash) or mtp_serve.sh (mtp)": the launchers as an option's help names them
LAUNCHERS_HELP = " or ".join(f"{script} ({name})" for name, script in LAUNCHER_SCRIPTS.items())
IMAGE_LAUNCHERS = Path("/opt/sparkserve")  # where the images keep serve.sh and mtp_serve.sh


def launcher_dir() -> Path:
    """The checkout's launchers when run from one, the image's otherwise."""
    checkout = CHECKOUT_DIR.parent
    return checkout if (checkout / LAUNCHER_SCRIPTS["dflash"]).is_file() else IMAGE_LAUNCHERS


# Knobs a recipe may set: what the model needs. Access, network, guard and launcher behaviour
# stay the user's.
RECIPE_KNOBS: frozenset[str] = frozenset(
    name
    for name, knob in BY_NAME.items()
    if knob.group in ("model", "memory")
    and name not in ("RECIPE", "OS_RESERVE_GB")
    and not name.startswith("GUARD")
)
REQUIRED = ("title", "launchers", "weights_gib", "sources", "knobs")


@dataclass(frozen=True)
class VerifyLimits:
    """What `sparkserve verify` tolerates for a model (natural log; docs/VERIFY.md says why):
    the int8 head may move a chosen token's log-probability by `head_max_delta`, and two
    log-probabilities closer than `numeric_tie` are a tie that a different order of the same
    arithmetic may break either way. A recipe's optional `[verify]` table sets them."""

    head_max_delta: float = 0.1
    numeric_tie: float = 0.15


class RecipeError(KnobError):
    """A recipe cannot be used; the message is one line naming it and the problem."""


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    title: str
    launchers: tuple[Launcher, ...]
    weights_gib: float
    drafter_weights_gib: float
    sources: tuple[str, ...]
    notes: str
    shared: dict[str, str]
    per_launcher: dict[str, dict[str, str]]
    verify: VerifyLimits = VerifyLimits()

    @property
    def geometry(self) -> Path:
        return self.path.parent / self.name

    @property
    def drafter_geometry(self) -> Path:
        return self.geometry / "drafter"

    def weights_bytes(self, launcher: Launcher) -> int:
        """The checkpoints the launcher loads: the target, and the drafter with DFlash."""
        gib = self.weights_gib + (self.drafter_weights_gib if launcher == "dflash" else 0)
        return int(gib * GIB)

    def check_fits(self, launcher: Launcher, share: int) -> None:
        """RecipeError when its weights leave no KV memory in vLLM's share (bytes)."""
        problem = fit_problem(share, self.weights_bytes(launcher), int(DEFAULT_OVERHEAD_GIB * GIB))
        if problem is not None:
            raise RecipeError(f"RECIPE={self.name}: {problem} (GPU_MEM of this machine)")

    def knobs_for(self, launcher: Launcher) -> dict[str, str]:
        """The recipe's knob values for one launcher (shared values, then its own)."""
        values = dict(self.shared)
        values.update(self.per_launcher.get(launcher, {}))
        return {k: v for k, v in values.items() if launcher in BY_NAME[k].launchers}


def recipes_dir(env: Mapping[str, str] | None = None) -> Path:
    """$SPARKSERVE_RECIPES, else this checkout's recipes/, else the image's."""
    env = os.environ if env is None else env
    if env.get("SPARKSERVE_RECIPES"):
        return Path(env["SPARKSERVE_RECIPES"])
    return CHECKOUT_DIR if CHECKOUT_DIR.is_dir() else IMAGE_DIR


def names(directory: Path) -> list[str]:
    return sorted(path.stem for path in directory.glob("*.toml"))


def _number(data: dict[str, Any], key: str, where: str) -> float:
    value = data.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 4096:
        raise RecipeError(f"{where}: {key} = {value!r}: must be a number of GiB from 0 to 4096")
    return float(value)


def _knob_values(table: dict[str, Any], where: str, launcher: str | None) -> dict[str, str]:
    values: dict[str, str] = {}
    for name, raw in table.items():
        if name not in RECIPE_KNOBS:
            allowed = ", ".join(sorted(RECIPE_KNOBS))
            raise RecipeError(f"{where}: knob {name!r} cannot be set by a recipe; one of {allowed}")
        knob = BY_NAME[name]
        if launcher is not None and launcher not in knob.launchers:
            raise RecipeError(f"{where}: {name} is not read by the {launcher} launcher")
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise RecipeError(f"{where}: {name} = {raw!r}: must be a string or a number")
        try:
            values[name] = knob.check(str(raw))
        except KnobError as error:
            raise RecipeError(f"{where}: {error}") from None
    return values


def _verify_limits(table: Any, where: str) -> VerifyLimits:
    if not isinstance(table, dict):
        raise RecipeError(f"{where}: must be a table")
    allowed = VerifyLimits.__dataclass_fields__
    values: dict[str, float] = {}
    for key, value in table.items():
        if key not in allowed:
            raise RecipeError(f"{where}: unknown limit {key!r}; one of {', '.join(allowed)}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 10:
            raise RecipeError(f"{where}: {key} = {value!r}: must be a number above 0, at most 10")
        values[key] = float(value)
    return VerifyLimits(**values)


def parse(path: Path) -> Recipe:
    """Read and check one recipe file; RecipeError (one line) on any problem."""
    where = str(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise RecipeError(f"{where}: not valid TOML ({error})") from None
    except OSError as error:
        raise RecipeError(f"{where}: cannot read ({error.strerror})") from None
    missing = [key for key in REQUIRED if key not in data]
    if missing:
        raise RecipeError(f"{where}: missing {', '.join(missing)} (needs {', '.join(REQUIRED)})")
    unknown = set(data) - {*REQUIRED, "drafter_weights_gib", "notes", "verify"}
    if unknown:
        raise RecipeError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    launchers = data["launchers"]
    if (
        not isinstance(launchers, list)
        or not launchers
        or any(item not in LAUNCHERS for item in launchers)
        or len(set(launchers)) != len(launchers)
    ):
        raise RecipeError(
            f"{where}: launchers = {launchers!r}: must list some of {', '.join(LAUNCHERS)}"
        )
    sources = data["sources"]
    if not isinstance(sources, list) or not sources or not all(isinstance(s, str) for s in sources):
        raise RecipeError(f"{where}: sources must be a non-empty list of strings (public pages)")
    knobs = data["knobs"]
    if not isinstance(knobs, dict):
        raise RecipeError(f"{where}: [knobs] must be a table")
    per_launcher = {
        launcher: _knob_values(knobs.pop(launcher), f"{where} [knobs.{launcher}]", launcher)
        for launcher in LAUNCHERS
        if isinstance(knobs.get(launcher), dict)
    }
    recipe = Recipe(
        name=path.stem,
        path=path,
        title=str(data["title"]),
        launchers=tuple(launchers),
        weights_gib=_number(data, "weights_gib", where),
        drafter_weights_gib=_number(data, "drafter_weights_gib", where),
        sources=tuple(sources),
        notes=str(data.get("notes", "")),
        shared=_knob_values(knobs, f"{where} [knobs]", None),
        per_launcher=per_launcher,
        verify=_verify_limits(data.get("verify", {}), f"{where} [verify]"),
    )
    if "MODEL" not in recipe.shared:
        raise RecipeError(f"{where}: [knobs] must set MODEL")
    needed = [recipe.geometry / "config.json"]
    if "dflash" in recipe.launchers:
        needed.append(recipe.drafter_geometry / "config.json")
        if "DRAFT_MODEL" not in recipe.knobs_for("dflash"):
            raise RecipeError(f"{where}: serves with dflash but sets no DRAFT_MODEL")
    for config in needed:
        if not config.is_file():
            raise RecipeError(f"{where}: no {config} (the model's geometry, for offline checks)")
    return recipe


def load(name: str, env: Mapping[str, str] | None = None) -> Recipe:
    directory = recipes_dir(env)
    path = directory / f"{name}.toml"
    if not path.is_file():
        known = names(directory)
        if not known:
            raise RecipeError(f"RECIPE={name!r}: no such recipe; {directory} holds none")
        raise RecipeError(f"RECIPE={name!r}: no such recipe; one of {', '.join(known)}")
    return parse(path)


def load_all(env: Mapping[str, str] | None = None) -> list[Recipe]:
    directory = recipes_dir(env)
    return [parse(directory / f"{name}.toml") for name in names(directory)]


def geometry_of(model: str, env: Mapping[str, str] | None = None) -> Path | None:
    """The folder holding a shipped recipe's copy of MODEL's config.json, or None."""
    for recipe in load_all(env):
        if recipe.shared.get("MODEL") == model:
            return recipe.geometry
    return None
