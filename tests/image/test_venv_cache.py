"""The test command's venv cache (scripts/lib/venv.sh): a build of one key drops the other
keys of that venv only once they are a day unused, so two checkouts with other pins can run
the suite at once without deleting each other's venv."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A stand-in interpreter: prints a version, and makes a venv whose python accepts pip calls.
FAKE_PYTHON = """#!/usr/bin/env bash
set -euo pipefail
if [[ "$1" == "-c" ]]; then echo 3.11-fake; exit 0; fi
if [[ "$1 $2" == "-m venv" ]]; then
  mkdir -p "$3/bin"
  printf '#!/usr/bin/env bash\\nexit 0\\n' >"$3/bin/python"
  chmod +x "$3/bin/python"
fi
"""


def build(cache: Path, python: Path, key_file: Path) -> Path:
    script = (
        f'source "{REPO}/scripts/lib/venv.sh"; noop() {{ :; }}; '
        f'ensure_venv demo "{python}" noop "{key_file}"'
    )
    done = subprocess.run(
        ["bash", "-c", script], env=dict(os.environ, SPARKSERVE_CACHE=str(cache)),
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return Path(done.stdout.strip())


def test_a_new_key_keeps_a_recently_used_venv_and_drops_a_stale_or_half_built_one(
    tmp_path: Path,
) -> None:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    cache, pins = tmp_path / "cache", tmp_path / "pins"
    pins.write_text("one\n")
    first = build(cache, python, pins)
    assert (first / ".complete").is_file()
    stale = cache / "venv-demo-stale"
    (stale / "bin").mkdir(parents=True)
    (stale / ".complete").touch()
    two_days_ago = time.time() - 2 * 86400
    os.utime(stale / ".complete", (two_days_ago, two_days_ago))
    half_built = cache / "venv-demo-halfbuilt"
    half_built.mkdir()

    pins.write_text("two\n")
    second = build(cache, python, pins)

    assert second != first and (second / ".complete").is_file()
    assert (first / ".complete").is_file(), "a venv used today was deleted"
    assert not stale.exists() and not half_built.exists()
    assert build(cache, python, pins) == second
