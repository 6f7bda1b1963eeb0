"""Issue 50's three ways out of the doubled target block, measured on the CPU with vLLM's own
planning functions and scheduler on the Spark layout (Qwen3.5-122B-A10B geometry from
config.json, DFlash n=12, prefix caching, Mamba align mode, 26.55 GiB of KV memory: the plan's
at GPU_MEM 0.82 with the bf16 head).

Cases: stock; (a) `--prefix-match-unit 1120` in EXTRA_ARGS; (b) VLLM_KV_CACHE_LAYOUT=BLNHC;
(c) the trial patch hybrid-page-divide. For each: the KV groups' blocks, the scheduler and
hash blocks, the hit unit, the pool in tokens (vLLM's get_kv_cache_capacity), and the tokens
vLLM's Scheduler reuses when a prompt is sent again and when a second prompt shares a prefix
(tests/scenarios/prefix_hits_scenario.py). Run with the pinned vLLM importable and
VLLM_TARGET_DEVICE=cpu:

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=src:tests python benchmarks/kv_page_options.py OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

from support.geometry import write_geometry_models  # noqa: E402

CASES = {
    "stock": {},
    "a: --prefix-match-unit 1120": {"extra_args": "--prefix-match-unit 1120"},
    "b: VLLM_KV_CACHE_LAYOUT=BLNHC": {"env": {"VLLM_KV_CACHE_LAYOUT": "BLNHC"}},
    "c: hybrid-page-divide": {"patches": ["hybrid-page-divide"]},
}


def main() -> int:
    out = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as work:
        target, drafter = write_geometry_models(Path(work))
        cases = {
            name: {"target": str(target), "drafter": str(drafter), **case}
            for name, case in CASES.items()
        }
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path[:2]))
        subprocess.run(
            [sys.executable, str(REPO / "tests/scenarios/prefix_hits_scenario.py"),
             json.dumps(cases), str(out)],
            check=True, env=env, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    results = json.loads(out.read_text())
    stock = results["stock"]["pool_tokens"]
    print("| case | groups' blocks | scheduler / hash block | hit unit | pool tokens | "
          "repeated prompt: hit | shared prefix: hit |")  # fmt: skip
    print("| --- " * 7 + "|")
    for name, r in results.items():
        blocks = sorted(set(r["groups"]))
        repeated = ", ".join(f"{k}: {v}" for k, v in r["repeated"].items())
        shared = ", ".join(f"{k}: {v}" for k, v in r["shared"].items())
        print(
            f"| {name} | {len(r['groups'])} groups, {blocks} | {r['scheduler_block']} / "
            f"{r['hash_block']} | {r['hit_unit']} | {r['pool_tokens']:,} "
            f"({r['pool_tokens'] / stock - 1:+.1%}) | {repeated} | {shared} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
