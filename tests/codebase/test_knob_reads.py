"""Logic reads a knob one way: `Settings.values`, typed and parsed once. A knob's text
(`Settings.text`) is read only where an argv, an environment or a message is built; this test
reads every module and names each one that reads it anywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "sparkserve"

# module: why it needs the text
TEXT_READERS = {
    "launch/vllm_command.py": "vLLM's argv and environment",
    "launch/start_parts.py": "the guard's and the pair watch's argv",
    "start/cli.py": "what it hands the shell: the link's exports and the banner line",
    "doctor/cli.py": "its table shows each value as set, and the link's rows check the text",
    "plan/single.py": "its JSON's inputs and its messages quote each value as set",
    "plan/recipes_cli.py": "`recipes show` prints the knobs the launcher resolves",
    "bench/benchy/cli.py": "the report names the settings it ran with (secrets left out)",
    "tune/cli.py": "the starting value it puts back into the server's environment",
}


# The names a Settings goes by in src: the settings, and what a running server was started with.
SETTINGS_NAMES = {"settings", "served"}


def is_settings(node: ast.expr | None) -> bool:
    """`settings` / `served`, or `<anything>.settings` / `<anything>.served`."""
    if isinstance(node, ast.Name):
        return node.id in SETTINGS_NAMES
    return isinstance(node, ast.Attribute) and node.attr in SETTINGS_NAMES


def reads_of_text(path: Path) -> list[int]:
    """Lines where `settings.text` / `<x>.settings.text` is read, or a Settings is indexed
    (`settings[...]`), in one module."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        text_read = isinstance(node, ast.Attribute) and node.attr == "text"
        if (text_read or isinstance(node, ast.Subscript)) and is_settings(node.value):
            lines.append(node.lineno)
    return sorted(lines)


def test_knob_text_is_read_only_where_an_argv_an_environment_or_a_message_is_built() -> None:
    found = {
        str(path.relative_to(SRC)): lines
        for path in sorted(SRC.rglob("*.py"))
        if (lines := reads_of_text(path))
    }
    outside = {module: lines for module, lines in found.items() if module not in TEXT_READERS}
    assert outside == {}, "read the knob through settings.values (typed) instead"
    unused = sorted(set(TEXT_READERS) - set(found))
    assert unused == [], "these no longer read a knob's text: take them off TEXT_READERS"


def test_the_rule_finds_an_indexed_read_and_a_text_read(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f(settings, start):\n"
        "    a = settings['MODEL']\n"
        "    b = start.settings.text['HF_HOME']\n"
        "    c = settings.values.MODEL\n"
        "    d = other.text\n"
    )
    assert reads_of_text(module) == [2, 3]
