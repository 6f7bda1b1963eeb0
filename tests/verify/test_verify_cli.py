"""`sparkserve verify` refuses bad input in one line with exit 2, before any restart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.vllm_server import free_port

REPO = Path(__file__).resolve().parents[2]


def verify(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "sparkserve", "verify", *args],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("--checks", "head,nope"),
            "bad --checks 'nope': one or more of api,prefix,speculation,head",
        ),
        (("--checks", ","), "bad --checks ',': one or more of"),
        (("--gen-tokens", "2"), "--gen-tokens"),
        (("--driver", "ssh"), "--driver"),
    ],
)
def test_bad_options_are_one_line(args: tuple[str, ...], line: str, tmp_path: Path) -> None:
    done = verify(*args, "--url", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "o"))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and line in done.stderr, done.stderr
    assert not (tmp_path / "o").exists()


def test_no_server_is_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    port = free_port()
    done = verify("--url", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "o"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("sparkserve verify: server not usable:"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
