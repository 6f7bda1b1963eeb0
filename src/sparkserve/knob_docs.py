"""Write the registry out where people read it: compose, .env.example, the docs tables.

Each target file holds a region between two marker lines that `sparkserve knobs sync`
rewrites from the registry; `sparkserve knobs sync --check` (run by the tests) fails on drift.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from sparkserve.knobs import GROUP_TITLES, KNOBS, Knob

BEGIN = ">>> knobs: generated from src/sparkserve/knobs.py by `sparkserve knobs sync`"
END = "<<< knobs"


def compose_value(knob: Knob) -> str:
    # ${X-d} keeps an empty value (empty means "off" for these); ${X:-d} treats empty as unset.
    operator = "-" if knob.empty_ok else ":-"
    return f'"${{{knob.name}{operator}{knob.default}}}"'


def render_compose(indent: str) -> list[str]:
    return [f"{indent}{knob.name}: {compose_value(knob)}" for knob in KNOBS]


def render_env_example(indent: str) -> list[str]:
    lines: list[str] = []
    for knob in KNOBS:
        lines.append(f"{indent}# {knob.why}")
        default = knob.default
        if knob.mtp_default is not None:
            default += f" (mtp_serve.sh: {knob.mtp_default})"
        lines.append(f"{indent}# allowed: {knob.allowed()}; default: {default or '(empty)'}")
        lines.append(f"{indent}#{knob.name}={knob.default}")
        lines.append("")
    return lines[:-1]


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(indent: str) -> list[str]:
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
            if knob.mtp_default is not None:
                default += f" (MTP: `{knob.mtp_default}`)"
            only = "" if len(knob.launchers) > 1 else f" ({knob.launchers[0]} only)"
            lines.append(
                f"| `{knob.name}`{only} | {default} | {_markdown_cell(knob.allowed())} "
                f"| {_markdown_cell(knob.why)} |"
            )
        lines.append("")
    return [indent + line if line else line for line in lines[:-1]]


TARGETS: dict[str, Callable[[str], list[str]]] = {
    "docker-compose.yml": render_compose,
    ".env.example": render_env_example,
    "docs/KNOBS.md": render_markdown,
    "README.md": render_markdown,
}


def regenerate(
    text: str,
    render: Callable[[str], list[str]],
    name: str,
    begin: str = BEGIN,
    end: str = END,
) -> str:
    """`text` with the one region between the `begin` and `end` marker lines re-rendered."""
    pattern = re.compile(
        rf"^(?P<indent>[ \t]*)(?P<lead>#|<!--) {re.escape(begin)}.*?\n(?P<body>.*?)"
        rf"^(?P=indent)(?:#|<!--) {re.escape(end)}.*?$",
        re.MULTILINE | re.DOTALL,
    )
    matches = list(pattern.finditer(text))
    if len(matches) != 1:
        raise ValueError(f"{name}: expected one generated region {begin!r}, found {len(matches)}")
    match = matches[0]
    body = "\n".join(render(match.group("indent"))) + "\n"
    return text[: match.start("body")] + body + text[match.end("body") :]


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
