"""The planner's pool for a CPU server's configuration, computed with the CPU serving venv's vLLM
(the servers' release), and the pool a server logged."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


POOL_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")


def logged_pool(log: Path) -> int:
    found = POOL_LINE.findall(log.read_text(errors="replace"))
    assert found, f"no 'KV cache size' line in {log}"
    return int(found[-1].replace(",", ""))


CPU_PLAN = """
import json, sys
from pathlib import Path
from sparkserve.memory.kv import KvRequest, kv_geometry
out = {}
for name, case in json.loads(sys.argv[1]).items():
    drafter = Path(case["drafter"]) if case.get("drafter") else None
    req = KvRequest(target=Path(case["target"]), drafter=drafter, spec_method=case["method"],
        num_spec_tokens=case["n"], max_model_len=4096, max_num_seqs=3, max_batched_tokens=8192,
        kv_bytes=case["kv_bytes"], prefix_cache=case["prefix"], platform="cpu",
        backend="CPU_ATTN")
    out[name] = kv_geometry(req).pool_tokens
print(json.dumps(out))
"""


def start_cpu_plans(python: str, cases: dict[str, dict[str, Any]]) -> Callable[[], dict[str, int]]:
    """Starts the plans with the CPU serving venv's vLLM (the servers' release), one process
    for all, in the background; the function returned waits for them."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), VLLM_TARGET_DEVICE="cpu")
    proc = subprocess.Popen(
        [python, "-c", CPU_PLAN, json.dumps(cases)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip

    def pools() -> dict[str, int]:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        return json.loads(out.strip().splitlines()[-1])

    return pools


def cpu_plans(python: str, cases: dict[str, dict[str, Any]]) -> dict[str, int]:
    return start_cpu_plans(python, cases)()
