"""The next vLLM release (versions.env VLLM_NEXT_VERSION) on trial: every version-sensitive
test (marker `release`: the planner, the launchers' argv through vLLM's parser, the head
plugin's runners, the prefix-align patch's verdict, the metric names) passes on its Python
sources too, none skipped, so that moving the image to it (scripts/bump-vllm.sh) starts from a
known verdict. scripts/test.sh fetches the sources (requirements/vllm-next-sources.lock)."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from support import vllm_release

REPO = Path(__file__).resolve().parents[2]
# minutes of one test process: the whole CI run has it, the contributors' --quick leaves it out
pytestmark = pytest.mark.whole_suite
NEXT_SOURCE_ENV = "SPARKSERVE_VLLM_NEXT_SRC"  # set by scripts/test.sh


@pytest.fixture(scope="module")
def next_source() -> Path:
    if vllm_release.PINS["VLLM_NEXT_VERSION"] == vllm_release.PINS["VLLM_VERSION"]:
        pytest.skip("no release on trial: versions.env's VLLM_NEXT_VERSION is the pinned one")
    value = os.environ.get(NEXT_SOURCE_ENV)
    if not value:
        pytest.skip(f"{NEXT_SOURCE_ENV} is unset: run through ./scripts/test.sh")
    return Path(value)


def next_env(source: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env[vllm_release.SOURCE_ENV] = str(source)
    env["PYTHONPATH"] = os.pathsep.join([str(source), str(REPO / "src")])
    return env


def test_the_next_release_sources_are_the_version_named(next_source: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import vllm; print(vllm.__version__, vllm.__file__)"],
        env=next_env(next_source), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    version, path = done.stdout.split()[-2:]
    assert version == vllm_release.PINS["VLLM_NEXT_VERSION"]
    assert path.startswith(str(next_source))


def test_every_version_sensitive_test_passes_on_the_next_release(
    next_source: Path, tmp_path: Path
) -> None:
    report = tmp_path / "release.xml"
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-m", "release", "-n", "0", "-q",
            "-p", "no:cacheprovider", f"--junitxml={report}", "tests",
        ],
        cwd=REPO, env=next_env(next_source), capture_output=True, text=True, timeout=1200,
        check=False,
    )  # fmt: skip
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, tail
    suite = ElementTree.parse(report).getroot().find("testsuite")
    assert suite is not None, tail
    counts = {key: int(suite.get(key, "0")) for key in ("tests", "skipped", "failures", "errors")}
    assert counts["skipped"] == counts["failures"] == counts["errors"] == 0, (counts, tail)
    assert counts["tests"] >= 10, (counts, tail)
