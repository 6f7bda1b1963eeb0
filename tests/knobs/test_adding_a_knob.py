"""Adding a knob is one declaration plus the code that reads it: in a copy of this checkout,
one `Knob(...)` line added to the registry and `sparkserve knobs sync` put it in compose, in
.env.example, in the docs' tables and in the typed values, the drift check passes, and the
launchers' resolution takes, types and refuses it with nothing else edited."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GENERATED = ("docker-compose.yml", ".env.example", "docs/KNOBS.md", "README.md")
NEW_KNOB = (
    '    Knob("DEMO_WIDGETS", "int", "3", group="launcher", minimum=1, maximum=9,\n'
    '         why="How many demo widgets (a test\'s knob)."),\n'
)
REGISTRY_END = ")  # fmt: skip\n\nBY_NAME"


def sparkserve(
    copy: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sparkserve", *args], cwd=copy,
        env=dict(os.environ, PYTHONPATH=str(copy / "src")),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def resolve(copy: Path, value: str) -> subprocess.CompletedProcess:
    code = (
        "from sparkserve.launch.settings import resolve_settings\n"
        "from sparkserve.knobs.registry import KnobError\n"
        "try:\n"
        f"    settings = resolve_settings({{'DEMO_WIDGETS': {value!r}}}, 'dflash')\n"
        "except KnobError as error:\n"
        "    raise SystemExit(str(error))\n"
        "print(repr(settings.values.DEMO_WIDGETS), settings.layer['DEMO_WIDGETS'])\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=copy, env=dict(os.environ, PYTHONPATH=str(copy / "src")),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_one_declaration_reaches_every_generated_file_and_the_resolution(tmp_path: Path) -> None:
    copy = tmp_path / "checkout"
    shutil.copytree(REPO / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "recipes", copy / "recipes")
    for name in GENERATED:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, copy / name)
    registry = copy / "src/sparkserve/knobs/registry.py"
    text = registry.read_text()
    assert text.count(REGISTRY_END) == 1, "the registry's tuple no longer ends as this test expects"
    registry.write_text(text.replace(REGISTRY_END, NEW_KNOB + REGISTRY_END))

    check = sparkserve(copy, "knobs", "sync", "--check")
    assert check.returncode != 0, "the drift check missed a knob the generated files lack"
    synced = sparkserve(copy, "knobs", "sync")
    assert synced.returncode == 0, synced.stderr

    for name in (*GENERATED, "src/sparkserve/knobs/values.py"):
        assert "DEMO_WIDGETS" in (copy / name).read_text(), f"{name} did not follow the registry"
    assert "DEMO_WIDGETS: int" in (copy / "src/sparkserve/knobs/values.py").read_text()
    again = sparkserve(copy, "knobs", "sync", "--check")
    assert again.returncode == 0, again.stdout + again.stderr

    took = resolve(copy, "7")
    assert took.returncode == 0, took.stderr
    assert took.stdout.split() == ["7", "user"]
    refused = resolve(copy, "12")
    assert refused.returncode == 1
    assert "DEMO_WIDGETS" in refused.stderr and "'12'" in refused.stderr, refused.stderr
    assert "from 1 to 9" in refused.stderr, refused.stderr
    default = resolve(copy, "")
    assert default.stdout.split() == ["3", "registry"], default.stdout + default.stderr
