"""What every launcher prints for a dry run, per launcher x image x recipe and a few knobs:
the exact vLLM argv and environment, the fetch, guard and watch commands (the watched PID
masked). Recorded in tests/launch/data/dry_runs.json; a change to it is a change to what
starts, made on purpose (`python tests/support/dry_runs.py` records it again)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "tests" / "launch" / "data" / "dry_runs.json"
SCRIPTS = {"dflash": "serve.sh", "mtp": "mtp_serve.sh"}
# Knobs a user commonly sets, each on the default dflash and mtp starts.
VARIANTS: dict[str, dict[str, str]] = {
    "key": {"API_KEY": "sk-dry", "HF_TOKEN": "hf_dry"},
    "no-thinking": {"THINKING": "0"},
    "no-drain": {"SHUTDOWN_TIMEOUT_S": "0"},
    "fixed-pool": {"KV_CACHE_GB": "6.5"},
    "no-prefix-cache": {"PREFIX_CACHE": "0"},
    "no-guard": {"GUARD": "0"},
    "no-drafter": {"NUM_SPEC_TOKENS": "0"},
    "extra-args": {"EXTRA_ARGS": "--enforce-eager --max-num-seqs 2"},
    "ngram": {"SPEC_METHOD": "ngram"},
    "open": {
        "BIND_ADDRESS": "0.0.0.0",
        "API_KEY": "sk-dry",
        "ALLOWED_HOSTS": "spark.lan",
        "ALLOWED_ORIGINS": "http://spark.lan:3000,https://chat.example",
    },
}


def cases(repo: Path) -> dict[str, tuple[str, dict[str, str]]]:
    recipes: dict[str, list[str]] = {}
    for path in sorted((repo / "recipes").glob("*.toml")):
        recipes[path.stem] = tomllib.loads(path.read_text())["launchers"]
    found: dict[str, tuple[str, dict[str, str]]] = {}
    for launcher in SCRIPTS:
        for image in ("spark", "cpu"):
            found[f"{launcher}/{image}/default"] = (launcher, {"SPARKSERVE_IMAGE": image})
            for recipe, launchers in recipes.items():
                if launcher in launchers:
                    found[f"{launcher}/{image}/{recipe}"] = (
                        launcher, {"SPARKSERVE_IMAGE": image, "RECIPE": recipe}
                    )  # fmt: skip
        for name, knobs in VARIANTS.items():
            found[f"{launcher}/spark/{name}"] = (launcher, {"SPARKSERVE_IMAGE": "spark", **knobs})
    return found


def _base_env(repo: Path) -> dict[str, str]:
    """This process's PATH and nothing of the user's knobs; the cache on a path no machine has."""
    return {
        "PATH": os.environ["PATH"], "PYTHONPATH": str(repo / "src"), "LANG": "C.UTF-8",
        "HOME": os.environ.get("HOME", "/root"), "HF_HOME": "/models", "HF_OFFLINE": "1",
        "OS_RESERVE_GB": "4", "DRY_RUN": "1",
    }  # fmt: skip


def dry_run(repo: Path, launcher: str, knobs: dict[str, str]) -> str:
    done = subprocess.run(
        [str(repo / SCRIPTS[launcher])], env={**_base_env(repo), **knobs},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{launcher} {knobs}: exit {done.returncode}: {done.stderr[-2000:]}")
    return re.sub(r"'--pid' '\d+'", "'--pid' 'PID'", done.stdout)


def dry_runs(repo: Path = REPO) -> dict[str, str]:
    chosen = cases(repo)
    with ThreadPoolExecutor(max_workers=4) as pool:
        outputs = pool.map(lambda case: dry_run(repo, *case), chosen.values())
        return dict(zip(chosen, outputs, strict=True))


if __name__ == "__main__":
    repo = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else REPO
    RECORD.write_text(json.dumps(dry_runs(repo), indent=1, sort_keys=True) + "\n")
    print(f"recorded {RECORD.relative_to(REPO)} from {repo.name}")
