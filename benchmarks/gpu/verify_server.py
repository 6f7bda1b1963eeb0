"""The server `sparkserve verify` checks on a borrowed CUDA host (benchmarks/gpu/h200.sh verify):
serve.sh started as `sparkserve selftest`'s `dflash` case starts it (the recipe's geometry with
8 layers and no weights, in the selftest's own model folder under HF_HOME; DFlash, the int8
head, prefix caching, the shipped defaults), in a session of its own, so that it outlives this
script and verify's launcher driver can restart it.

    python3 benchmarks/gpu/verify_server.py --work DIR [--timeout-s 900]

Writes DIR/server.pid (the launcher's pid, which verify updates on each restart), DIR/url,
DIR/key (the API key) and DIR/server-start.log, waits for /health, and exits 0 once healthy
(the server keeps running), 1 when the launcher exits or the timeout passes first. The host's
own environment (HF_HOME, PYTHONPATH, VLLM_USE_FLASHINFER_SAMPLER, EXTRA_ARGS) is the
launcher's, and so every restart's.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from sparkserve.knobs.registry import BY_NAME
from sparkserve.memory.checkpoint import hf_home
from sparkserve.recipes import launcher_dir
from sparkserve.selftest import cases
from sparkserve.selftest.models import keep_models, models_home
from sparkserve.selftest.run import DEFAULT_LAYERS


def say(line: str) -> None:
    print(f"verify_server: {line}", file=sys.stderr, flush=True)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    args = parser.parse_args()
    recipe = os.environ.get("RECIPE") or BY_NAME["RECIPE"].default
    models = keep_models(models_home(hf_home(), recipe, args.layers), recipe, args.layers)
    say(f"{recipe}: {models.layers} of {models.full_layers} layers, vocab {models.vocab}, "
        f"no weights: {models.target.parent}")  # fmt: skip
    case = cases.CASES["dflash"]
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(12)
    port = cases.free_port()
    base = dict(os.environ, RECIPE=recipe)
    env = cases.case_env(case, models, base, port, key, work / "head-report")
    url = f"http://127.0.0.1:{port}"
    (work / "url").write_text(url + "\n")
    (work / "key").write_text(key + "\n")
    log = work / "server-start.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(launcher_dir() / case.script)], env=env, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    (work / "server.pid").write_text(f"{process.pid}\n")
    say(f"{case.script} ({case.why}) pid {process.pid} at {url}, log {log}")
    started = time.monotonic()
    said = started
    while time.monotonic() - started < args.timeout_s:
        if process.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            say(f"the launcher exited {process.returncode} before healthy: {' / '.join(tail)}")
            return 1
        if healthy(url):
            say(f"healthy in {time.monotonic() - started:.1f} s")
            return 0
        if time.monotonic() - said >= 30:
            said = time.monotonic()
            say(f"starting, {said - started:.0f} s")
        time.sleep(2)
    say(f"not healthy within {args.timeout_s:.0f} s (log {log})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
