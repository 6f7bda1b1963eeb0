"""Write the registry out where people read it: compose, .env.example, the docs tables, and
the typed attributes of knobs/values.py.

Each target file holds a region between two marker lines that `sparkserve knobs sync`
rewrites from the registry; `sparkserve knobs sync --check` (run by the tests) fails on drift.
docker-compose.yml's region is the one environment block of every server and fetch service:
each knob passed through only when the user sets it (in `.env`, the shell, or by editing its
line), its defaults in a comment, so that each launcher applies its own
(sparkserve.launch.settings).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from sparkserve.knobs.registry import GROUP_TITLES, KNOBS, STOP_MARGIN_S, Knob, stop_grace_s


def render_compose(indent: str) -> list[str]:
    """The environment block of compose's services (compose-only knobs never reach them): a
    key without a value passes the user's setting through, or nothing when there is none."""
    return [
        f"{indent}{knob.name}:  # default {knob.default or '(empty)'}{_other_defaults(knob)}"
        for knob in KNOBS
        if knob.scope == "container"
    ]


def render_router_compose(indent: str) -> list[str]:
    """The router service's own knobs (scope router), passed through as render_compose's are."""
    return [
        f"{indent}{knob.name}:  # default {knob.default or '(empty)'}"
        for knob in KNOBS
        if knob.scope == "router"
    ]


def _other_defaults(knob: Knob) -> str:
    """The defaults that differ from the main one, named: ' (MTP: 2; cpu image: 0)' or ''."""
    others = [("MTP", knob.mtp_default), ("cpu image", knob.cpu_default)]
    named = [f"{where}: {value or '(empty)'}" for where, value in others if value is not None]
    return f" ({'; '.join(named)})" if named else ""


def render_env_example(indent: str) -> list[str]:
    lines: list[str] = []
    for knob in KNOBS:
        lines.append(f"{indent}# {knob.why}")
        default = (knob.default or "(empty)") + _other_defaults(knob)
        lines.append(f"{indent}# allowed: {knob.allowed()}; default: {default}")
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
            default = (f"`{knob.default}`" if knob.default else "(empty)") + _other_defaults(knob)
            only = "" if len(knob.launchers) > 1 else f" ({knob.launchers[0]} only)"
            if knob.scope != "container":
                only += f" ({knob.scope})"
            lines.append(
                f"| `{knob.name}`{only} | {default} | {_markdown_cell(knob.allowed())} "
                f"| {_markdown_cell(knob.why)} |"
            )
        lines.append("")
    return [indent + line if line else line for line in lines[:-1]]


def render_stop_grace(indent: str) -> list[str]:
    """Compose's stop grace of every server, one anchor the services take it from: the longest
    drain SHUTDOWN_TIMEOUT_S allows plus the teardown after it (knobs.stop_grace_s)."""
    return [
        f"{indent}# SHUTDOWN_TIMEOUT_S's maximum + {STOP_MARGIN_S} s for vLLM's teardown: "
        "Docker SIGKILLs after it",
        f"{indent}x-stop-grace: &stop-grace {stop_grace_s()}s",
    ]


def render_values(indent: str) -> list[str]:
    """knobs/values.py's attributes: each container knob with its Python type."""
    return [
        f"{indent}{knob.name}: {knob.python_type()}" for knob in KNOBS if knob.scope == "container"
    ]


TARGETS: list[tuple[str, str, Callable[[str], list[str]]]] = [
    ("docker-compose.yml", "knobs", render_compose),
    ("docker-compose.yml", "stop-grace", render_stop_grace),
    ("docker-compose.yml", "router-knobs", render_router_compose),
    (".env.example", "knobs", render_env_example),
    ("docs/KNOBS.md", "knobs", render_markdown),
    ("README.md", "knobs", render_markdown),
    ("src/sparkserve/knobs/values.py", "knobs", render_values),
]


def regenerate(text: str, render: Callable[[str], list[str]], name: str, tag: str = "knobs") -> str:
    """`text` with its one region between `>>> TAG: ...` and `<<< TAG` marker lines (after `#`
    or `<!--`) rewritten by `render(indent)`; ValueError unless there is exactly one."""
    pattern = re.compile(
        rf"^(?P<indent>[ \t]*)(?P<lead>#|<!--) >>> {re.escape(tag)}:.*?\n(?P<body>.*?)"
        rf"^(?P=indent)(?:#|<!--) <<< {re.escape(tag)}\b.*?$",
        re.MULTILINE | re.DOTALL,
    )
    matches = list(pattern.finditer(text))
    if len(matches) != 1:
        raise ValueError(f"{name}: expected one generated {tag} region, found {len(matches)}")
    match = matches[0]
    body = "\n".join(render(match.group("indent"))) + "\n"
    return text[: match.start("body")] + body + text[match.end("body") :]


def sync_regions(
    repo: Path, targets: list[tuple[str, str, Callable[[str], list[str]]]], check: bool
) -> list[str]:
    """Rewrite (or with check, only compare) each (file, tag, render) region; return the
    files that drifted."""
    drifted: list[str] = []
    for name, tag, render in targets:
        path = repo / name
        text = path.read_text()
        fresh = regenerate(text, render, name, tag)
        if fresh != text:
            if name not in drifted:
                drifted.append(name)
            if not check:
                path.write_text(fresh)
    return drifted


def sync(repo: Path, check: bool) -> list[str]:
    """Rewrite (or with check, only compare) every target; return the names that drifted."""
    return sync_regions(repo, TARGETS, check)
