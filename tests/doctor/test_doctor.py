"""`sparkserve doctor` on this machine (no GPU; the suite's own Docker Engine when
./scripts/test.sh started it, otherwise none), and with a stand-in nvidia-smi and docker that
answer like a Spark's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.memory.checkpoint import cache_dir_name

REPO = Path(__file__).resolve().parents[2]


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sparkserve", "doctor", *args],
        capture_output=True, text=True, env=base, timeout=120, check=False,
    )  # fmt: skip


def rows(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    return {row["name"]: row for row in json.loads(done.stdout)}


def test_this_machine_is_reported_cleanly(tmp_path: Path) -> None:
    # No engine behind the socket: informational on a machine that is not a Spark.
    no_engine = {"HF_HOME": str(tmp_path / "hf"), "DOCKER_HOST": f"unix://{tmp_path}/none.sock"}
    done = doctor("--json", "--disk-need-gb", "1", env=no_engine)
    assert done.stderr == ""
    found = rows(done)
    assert found["machine"]["status"] == "info"
    assert "not a DGX Spark" in found["machine"]["detail"]
    assert found["GPU"]["status"] == "skip"
    assert found["Docker"]["status"] == "info"  # no engine (or no client): not a blocker here
    assert found["memory"]["status"] == "ok"
    assert found["knobs"]["status"] == "ok"
    assert done.returncode == 0, done.stdout
    table = doctor("--disk-need-gb", "1", env=no_engine)
    print(table.stdout)
    assert table.stdout.splitlines()[-1] == "no blockers: ready for a first run"


@pytest.mark.skipif(
    not os.environ.get("DOCKER_HOST"),
    reason="DOCKER_HOST is unset: ./scripts/test.sh starts the suite's Docker Engine and sets it",
)
def test_the_suites_docker_engine_is_found(tmp_path: Path) -> None:
    done = doctor("--json", "--disk-need-gb", "1", env={"HF_HOME": str(tmp_path / "hf")})
    found = rows(done)
    assert found["Docker"]["status"] == "ok", found["Docker"]
    assert found["Docker"]["detail"].startswith("engine 20.10"), found["Docker"]
    assert found["Docker Compose"]["status"] == "ok", found["Docker Compose"]
    assert "disk (Docker data)" in found, found  # the engine's data root is checked too


def test_blockers_exit_non_zero(tmp_path: Path) -> None:
    home = tmp_path / "hf"
    (home / "sparkserve").mkdir(parents=True)
    (home / "sparkserve" / "guard-stopped.json").write_text("{}")
    done = doctor("--json", "--disk-need-gb", "99999", env={"HF_HOME": str(home), "GPU_MEM": "2"})
    assert done.returncode == 1
    found = rows(done)
    assert found["knobs"]["status"] == "blocker"
    assert "GPU_MEM='2': must be a number from 0.1 to 0.95" in found["knobs"]["detail"]
    assert found["disk (HF cache)"]["status"] == "blocker"
    assert found["memory guard"]["status"] == "blocker"


def test_a_cached_model_is_found(tmp_path: Path) -> None:
    home = tmp_path / "hf"
    snapshot = home / "hub" / cache_dir_name("org/model") / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    done = doctor("--json", "--method", "mtp", env={"HF_HOME": str(home), "MODEL": "org/model"})
    assert rows(done)["cached org/model"]["status"] == "ok"


def test_a_spark_with_a_stand_in_gpu_and_docker(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA GB10, 12.1, 580.95.05'\n")
    info = {"ServerVersion": "28.5.1", "Runtimes": {"nvidia": {}, "runc": {}},
            "DockerRootDir": str(tmp_path)}  # fmt: skip
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        f"if [ \"$1\" = info ]; then echo '{json.dumps(info)}'; exit 0; fi\n"
        'if [ "$1" = compose ]; then echo 2.40.3; exit 0; fi\nexit 1\n'
    )
    for tool in ("nvidia-smi", "docker"):
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HF_HOME": str(tmp_path / "hf")}
    found = rows(doctor("--json", "--disk-need-gb", "1", env=env))
    assert found["machine"]["detail"] == "a DGX Spark (GB10)"
    assert found["GPU"]["status"] == "ok" and "12.1" in found["GPU"]["detail"]
    assert found["Docker GPU"]["status"] == "ok"
    assert found["Docker Compose"]["detail"] == "v2.40.3"
    # A GPU of another generation is a blocker: the image is built for sm_121.
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H100, 9.0, 580.95.05'\n")
    done = doctor("--json", "--disk-need-gb", "1", env=env)
    assert done.returncode == 1 and rows(done)["GPU"]["status"] == "blocker"


def test_bad_option_is_one_line() -> None:
    done = doctor("--disk-need-gb", "-5")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "sparkserve doctor: --disk-need-gb='-5': must be a number from 0 to 100000"
    ]
