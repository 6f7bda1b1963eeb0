"""Write the registry out where people read it: compose, .env.example, the docs tables.

Each target file holds regions between two marker lines that `sparkserve knobs sync`
rewrites from the registry; `sparkserve knobs sync --check` (run by the tests) fails on drift.
A region's begin line may name an image (`>>> knobs (cpu image): ...`): compose's cpu service
gets that image's defaults.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from sparkserve.knobs import GROUP_TITLES, IMAGES, KNOBS, Image, Knob

BEGIN = ">>> knobs"
GENERATED = ": generated from src/sparkserve/knobs.py by `sparkserve knobs sync`"
END = "<<< knobs"
Render = Callable[[str, Image], list[str]]


def compose_value(knob: Knob, image: Image = "spark") -> str:
    # ${X-d} keeps an empty value (empty means "off" for these); ${X:-d} treats empty as unset.
    operator = "-" if knob.empty_ok else ":-"
    return f'"${{{knob.name}{operator}{knob.default_for("dflash", image)}}}"'


def container_knobs() -> tuple[Knob, ...]:
    return tuple(knob for knob in KNOBS if knob.scope == "container")


def render_compose(indent: str, image: Image) -> list[str]:
    return [f"{indent}{knob.name}: {compose_value(knob, image)}" for knob in container_knobs()]


def _other_defaults(knob: Knob) -> list[str]:
    """The defaults that differ from the main one, named (MTP launcher, cpu image)."""
    others = []
    if knob.mtp_default is not None:
        others.append(("MTP", knob.mtp_default))
    if knob.cpu_default is not None:
        others.append(("cpu image", knob.cpu_default))
    return [f"{where}: {value or '(empty)'}" for where, value in others]


def render_env_example(indent: str, image: Image) -> list[str]:
    del image  # one .env serves every service
    lines: list[str] = []
    for knob in KNOBS:
        lines.append(f"{indent}# {knob.why}")
        default = knob.default or "(empty)"
        if others := _other_defaults(knob):
            default += f" ({'; '.join(others)})"
        lines.append(f"{indent}# allowed: {knob.allowed()}; default: {default}")
        lines.append(f"{indent}#{knob.name}={knob.default}")
        lines.append("")
    return lines[:-1]


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(indent: str, image: Image) -> list[str]:
    del image  # the tables show every image's defaults
    lines: list[str] = []
    for group, title in GROUP_TITLES.items():
        lines += [
            f"**{title}**",
            "",
            "| knob | default | allowed | why |",
            "| --- | --- | --- | --- |",
        ]
        for knob in (k for k in KNOBS if k.group == group):
            default = f"`{knob.default}`" if knob.default else "(empty)"
            if others := _other_defaults(knob):
                default += f" ({'; '.join(others)})"
            only = "" if len(knob.launchers) > 1 else f" ({knob.launchers[0]} only)"
            if knob.scope == "compose":
                only += " (compose)"
            lines.append(
                f"| `{knob.name}`{only} | {default} | {_markdown_cell(knob.allowed())} "
                f"| {_markdown_cell(knob.why)} |"
            )
        lines.append("")
    return [indent + line if line else line for line in lines[:-1]]


TARGETS: dict[str, Render] = {
    "docker-compose.yml": render_compose,
    ".env.example": render_env_example,
    "docs/KNOBS.md": render_markdown,
    "README.md": render_markdown,
}


REGION = re.compile(
    rf"^(?P<indent>[ \t]*)(?:#|<!--) {re.escape(BEGIN)}(?: \((?P<image>\w+) image\))?"
    rf"{re.escape(GENERATED)}.*?\n(?P<body>.*?)^(?P=indent)(?:#|<!--) {re.escape(END)}.*?$",
    re.MULTILINE | re.DOTALL,
)


def regenerate(text: str, render: Render, name: str) -> str:
    matches = list(REGION.finditer(text))
    if not matches:
        raise ValueError(f"{name}: no generated knobs region")
    pieces, start = [], 0
    for match in matches:
        image = match.group("image") or "spark"
        if image not in IMAGES:
            raise ValueError(f"{name}: unknown image {image!r} in a knobs region")
        pieces += [
            text[start : match.start("body")],
            "\n".join(render(match.group("indent"), image)) + "\n",
        ]
        start = match.end("body")
    return "".join(pieces) + text[start:]


def sync(repo: Path, check: bool) -> list[str]:
    """Rewrite (or with check, only compare) every target; return the names that drifted."""
    drifted: list[str] = []
    for name, render in TARGETS.items():
        path = repo / name
        text = path.read_text()
        fresh = regenerate(text, render, name)
        if fresh != text:
            drifted.append(name)
            if not check:
                path.write_text(fresh)
    return drifted
