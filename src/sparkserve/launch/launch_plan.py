"""One start's decisions, made once by the launcher's first step and read by its second.

`sparkserve knobs resolve` resolves and checks the settings against this machine, then hands
the launcher this plan (as JSON, in the shell variable LAUNCH_PLAN, never exported). After the
fetch, `sparkserve knobs command` reads it back on its standard input and adds the one fact the
first step could not have, the target's config.json: it reads neither the environment nor
this machine again, so the two steps cannot disagree.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparkserve import recipes
from sparkserve.knobs.registry import IMAGES, LAUNCHERS, Image, KnobError, Launcher, knobs_for
from sparkserve.knobs.values import KnobValues
from sparkserve.launch.settings import LAYERS, Layer, Settings

SCHEMA = 1


class PlanError(KnobError):
    """The plan handed to the second step cannot be read (one line)."""


@dataclass(frozen=True)
class LaunchPlan:
    launcher: Launcher
    image: Image
    text: dict[str, str]  # every knob the launcher reads, checked (secrets included)
    layer: dict[str, Layer]
    recipe: str | None  # the chosen recipe's file
    total_bytes: int  # this machine's memory, as the budget was checked against it
    vllm_version: str  # the installed vLLM's release, for the workarounds
    host_ip: str  # this node's address on a pair's link; empty on one node
    shipped_geometry: str | None  # a shipped recipe's copy of MODEL's config.json, if any
    notes: list[str]  # lines for the launcher to print

    @classmethod
    def of(
        cls,
        settings: Settings,
        total_bytes: int,
        vllm_version: str,
        host_ip: str,
        notes: list[str],
    ) -> LaunchPlan:
        shipped = recipes.geometry_of(settings["MODEL"])
        return cls(
            settings.launcher, settings.image, dict(settings.text), dict(settings.layer),
            str(settings.recipe.path) if settings.recipe is not None else None, total_bytes,
            vllm_version, host_ip, str(shipped) if shipped is not None else None, notes,
        )  # fmt: skip

    def settings(self) -> Settings:
        """The settings the first step resolved, as it resolved them."""
        recipe = recipes.parse(Path(self.recipe)) if self.recipe is not None else None
        return Settings(
            self.launcher, self.image, self.text, self.layer, recipe, KnobValues.parse(self.text)
        )

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, **asdict(self)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> LaunchPlan:
        """PlanError unless `text` is a plan this release wrote for a launcher's knobs."""
        try:
            data: dict[str, Any] = json.loads(text)
            if data.pop("schema") != SCHEMA:
                raise ValueError(f"schema is not {SCHEMA}")
            plan = cls(**data)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise PlanError(f"the launch plan on standard input is unreadable ({error})") from None
        known = plan.launcher in LAUNCHERS and plan.image in IMAGES
        names = {knob.name for knob in knobs_for(plan.launcher)} if known else set()
        if (
            not known
            or not isinstance(plan.text, dict)
            or not isinstance(plan.layer, dict)
            or set(plan.text) != names
            or set(plan.layer) != names
            or not set(plan.layer.values()) <= set(LAYERS)
        ):
            raise PlanError("the launch plan on standard input is not one for a launcher's knobs")
        return plan
