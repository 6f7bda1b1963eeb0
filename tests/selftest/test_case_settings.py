"""The selftest reads its cases' knobs as the launcher resolves them (the registry, the image,
the recipe, the user's), through the launchers' own call: a knob the launcher would refuse
fails the case by name, with no start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_knob_the_launcher_refuses_fails_each_case_by_name_with_no_start(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "sparkserve", "selftest", "--recipe", "tiny", "--cases",
         "bf16", "--out", str(out)],
        env=dict(os.environ, PYTHONPATH=str(REPO / "src"), SHUTDOWN_TIMEOUT_S="5000",
                 HF_HOME=str(tmp_path / "hf")),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    (result,) = json.loads((out / "selftest.json").read_text())["cases"]["bf16"]
    assert result["name"] == "healthy" and result["ok"] is False, result
    assert "SHUTDOWN_TIMEOUT_S" in result["detail"] and "'5000'" in result["detail"], result
    assert not (out / "bf16.log").exists(), "the launcher was started"
