"""The README's recipes table, generated from the recipe files (`sparkserve recipes sync`)."""

from __future__ import annotations

from pathlib import Path

from sparkserve.knobs.docs import regenerate
from sparkserve.recipes import LAUNCHER_SCRIPTS, Recipe

TARGET = "README.md"


def _speculative(recipe: Recipe) -> str:
    parts = []
    for launcher in recipe.launchers:
        knobs = recipe.knobs_for(launcher)
        tokens = knobs.get("NUM_SPEC_TOKENS", "?")
        if launcher == "dflash":
            parts.append(f"DFlash `{knobs.get('DRAFT_MODEL', '?')}`, {tokens} tokens")
        else:
            parts.append(f"MTP, {tokens} tokens")
    return "; or ".join(parts)


def render(recipes: list[Recipe]) -> list[str]:
    lines = [
        "| `RECIPE` | model | speculative | context x seqs | `GPU_MEM` | weights | launcher |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for recipe in recipes:
        knobs = recipe.knobs_for(recipe.launchers[0])
        scripts = ", ".join(f"`{LAUNCHER_SCRIPTS[item]}`" for item in recipe.launchers)
        lines.append(
            f"| `{recipe.name}` | `{knobs['MODEL']}` | {_speculative(recipe)} "
            f"| {knobs.get('MAX_MODEL_LEN', '?')} x {knobs.get('MAX_NUM_SEQS', '?')} "
            f"| {knobs.get('GPU_MEM', '?')} | {recipe.weights_gib:g} GiB | {scripts} |"
        )
    return lines


def sync(repo: Path, recipes: list[Recipe], check: bool) -> bool:
    """Rewrite (or with check, only compare) the README's table; True when it drifted."""
    path = repo / TARGET
    text = path.read_text()
    fresh = regenerate(text, lambda indent: render(recipes), TARGET, "recipes")
    if fresh != text and not check:
        path.write_text(fresh)
    return fresh != text
