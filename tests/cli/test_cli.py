"""The `sparkserve` entry point: every sub-command reachable, and only the typed one's module
imported (the launchers run `sparkserve start` on every start)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.cli import BUILT_IN, COMMAND_MODULES, build_parser

REPO = Path(__file__).resolve().parents[2]


def commands_of(parser: argparse.ArgumentParser) -> set[str]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


@pytest.mark.parametrize("name", sorted(COMMAND_MODULES))
def test_each_module_registers_exactly_its_command(name: str) -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    importlib.import_module(COMMAND_MODULES[name]).add_command(commands)
    assert set(commands.choices) == {name}


def test_the_whole_parser_has_every_command_and_one_typed_adds_only_its_own() -> None:
    assert commands_of(build_parser()) == set(BUILT_IN) | set(COMMAND_MODULES)
    assert commands_of(build_parser("plan")) == {*BUILT_IN, "plan"}
    assert commands_of(build_parser("knobs")) == set(BUILT_IN)


# What a launcher's first step runs, in a fresh interpreter: which tool modules it imported.
PROBE = """
import contextlib, io, json, sys
from sparkserve.cli import COMMAND_MODULES, main
with contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO())):  # a step writes bytes
    status = main(sys.argv[1:])
print(json.dumps([status, sorted(set(COMMAND_MODULES.values()) & set(sys.modules))]))
"""


def probe(*argv: str, **knobs: str) -> tuple[int, list[str]]:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OS_RESERVE_GB="4", **knobs)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    status, imported = json.loads(done.stdout)
    return status, imported


def test_a_launcher_step_imports_no_other_tool(tmp_path: Path) -> None:
    # the guard's module besides its own: where its record and metrics live is the start's
    # business; the fetch's steps come from its library module, not its command
    start = ("start", "--launcher", "mtp", "--pid", "1", "--records", str(tmp_path / "r"))
    # a host run: HOST beyond loopback with no API_KEY would be refused
    assert probe(*start, DRY_RUN="1", HOST="127.0.0.1") == (
        0,
        ["sparkserve.guard.monitor", "sparkserve.start.cli"],
    )


def test_a_tool_imports_its_own_module_only() -> None:
    # a pair's health without a watch's state file: exit 1, the cluster module alone
    health = ("cluster", "health", "--state-file", "/nonexistent/state.json")
    assert probe(*health) == (1, ["sparkserve.cluster.cli"])


def test_help_and_a_wrong_command_list_every_command() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    shown = subprocess.run(
        [sys.executable, "-m", "sparkserve", "--help"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    wrong = subprocess.run(
        [sys.executable, "-m", "sparkserve", "plna"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert wrong.returncode == 2 and "invalid choice: 'plna'" in wrong.stderr
    for name in (*BUILT_IN, *COMMAND_MODULES):
        assert name in shown.stdout
        assert f"'{name}'" in wrong.stderr
