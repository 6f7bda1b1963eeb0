"""Reading a compose .env as compose does, for the tools run on the host."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.launch.dotenv import DotenvError, parse, with_dotenv

REPO = Path(__file__).resolve().parents[2]


def test_parse_understands_what_compose_files_hold() -> None:
    text = (
        "# a comment\n\nPORT=9000\nexport API_KEY='s3cret #1'\nMODEL=\"org/model\"\n"
        "GPU_MEM=0.7  # tuned on a Spark\nTOOL_PARSER=\nEXTRA_ARGS=\"--a 'b c'\"\n"
    )
    assert parse(text) == {
        "PORT": "9000", "API_KEY": "s3cret #1", "MODEL": "org/model", "GPU_MEM": "0.7",
        "TOOL_PARSER": "", "EXTRA_ARGS": "--a 'b c'",
    }  # fmt: skip


def test_a_bad_line_names_file_and_line() -> None:
    with pytest.raises(DotenvError, match=r"^x.env:2: not KEY=value: 'oops'$"):
        parse("A=1\noops\n", "x.env")


def test_the_environment_wins_and_a_missing_file_is_no_file(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("PORT=9000\nAPI_KEY=k\n")
    assert with_dotenv({"PORT": "8001"}, env_file) == {"PORT": "8001", "API_KEY": "k"}
    assert with_dotenv({"PORT": "8001"}, tmp_path / "absent") == {"PORT": "8001"}
    assert with_dotenv({"PORT": "8001"}, None) == {"PORT": "8001"}


@pytest.mark.parametrize("script", ["stress_mem.sh", "bench.sh"])
def test_the_host_scripts_read_the_env_file(tmp_path: Path, script: str) -> None:
    """The scripts pick PORT up from .env: nothing listens there, so they stop at the probe
    with one line naming that address (no load is sent)."""
    env_file = tmp_path / ".env"
    env_file.write_text("PORT=9\nAPI_KEY=k\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PORT", "API_KEY")}
    env.update(PYTHON=sys.executable, SPARKSERVE_ENV_FILE=str(env_file))
    done = subprocess.run(
        [str(REPO / "scripts" / script), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "127.0.0.1:9" in done.stderr, done.stderr

    env_file.write_text("PORT 9\n")
    done = subprocess.run(
        [str(REPO / "scripts" / script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 2
    assert done.stderr.strip().endswith(f"{env_file}:1: not KEY=value: 'PORT 9'"), done.stderr
