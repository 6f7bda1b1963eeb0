"""What `restart: unless-stopped` does with a server that refuses to start, over minutes.

The real docker-compose.yml's `cpu` profile on the suite's Docker Engine, one compose project
per variant, all watched at once for --minutes:
  - guard-once: a guard record on the model volume (exit 3), the image's launcher: it says
    its line on the container's first refusal only;
  - guard-every: the same with SPARKSERVE_STATE_DIR emptied for the server, so the launcher
    says its line on every start (what it did before it kept a mark of having said it);
  - guard-wait: the same refusal, then the container waits for its stop instead of exiting
    (an entrypoint `serve.sh; exec sleep infinity`): the alternative of staying up;
  - knob-once: GPU_MEM=0.95 with OS_RESERVE_GB=64, which the fetch service passes and the
    server refuses against this machine's memory (exit 2).
Each starts with `docker compose up -d --wait --wait-timeout 60` (what it returns, how soon),
then every 2 s: Docker's RestartCount, the container's state and health, `docker compose ps`'s
STATUS, the lines in its log. MODEL is a folder inside the image, so nothing is fetched.
Needs the suite's Docker (DOCKER_HOST, Compose v2, the cpu image):

    ./scripts/with_suite_docker.sh env PYTHONPATH=src:tests \
        python benchmarks/refusal_restarts.py --minutes 5 --json refusals.json

Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from support.compose_project import ComposeProject

SERVICE = "sparkserve-cpu"
RECORD = {"reason": "a record written by benchmarks/refusal_restarts.py"}


def variants(work: Path) -> dict[str, tuple[dict[str, str], dict[str, Any]]]:
    """name: (.env, the override's settings for the server)."""
    guard = {"MODEL": "/opt", "HF_OFFLINE": "1", "OS_RESERVE_GB": "4"}
    return {
        "guard-once": (guard, {}),
        "guard-every": (guard, {"environment": {"SPARKSERVE_STATE_DIR": ""}}),
        "guard-wait": (guard, {"entrypoint": ["/bin/sh", "-c",
                                              "/opt/sparkserve/serve.sh; exec sleep infinity"]}),
        "knob-once": ({"MODEL": "/opt", "HF_OFFLINE": "1", "GPU_MEM": "0.95",
                       "OS_RESERVE_GB": "64"}, {}),
    }  # fmt: skip


def compose_status(project: ComposeProject) -> str:
    done = project.compose("ps", "-a", "--format", "{{.Service}}\t{{.Status}}", check=False)
    rows = dict(line.split("\t", 1) for line in done.stdout.splitlines() if "\t" in line)
    return rows.get(SERVICE, "(not listed)")


def watch(project: ComposeProject, minutes: float, result: dict[str, Any]) -> None:
    started = time.monotonic()
    up = project.up(SERVICE, wait_s=60, check=False)
    result["up_wait"] = {
        "rc": up.returncode,
        "s": round(time.monotonic() - started, 1),
        "last_line": (up.stderr.strip().splitlines() or [""])[-1][-160:],
    }
    samples = []
    watch_from = time.monotonic()
    while time.monotonic() - watch_from < minutes * 60:
        inspect = project.inspect(SERVICE)
        log = project.logs(SERVICE).splitlines()
        samples.append({
            "t_s": round(time.monotonic() - watch_from, 1),
            "restarts": inspect["RestartCount"],
            "status": inspect["State"]["Status"],
            "health": inspect["State"].get("Health", {}).get("Status", ""),
            "compose_ps": compose_status(project),
            "log_lines": len(log),
        })  # fmt: skip
        time.sleep(2)
    result["samples"] = samples
    result["end"] = samples[-1]
    statuses: dict[str, int] = {}
    for sample in samples:
        word = sample["compose_ps"].split(" ")[0]
        statuses[word] = statuses.get(word, 0) + 1
    result["compose_ps_words"] = statuses
    result["log"] = project.logs(SERVICE).splitlines()[-5:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--json", type=Path, default=Path("refusal-restarts.json"))
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    projects: list[ComposeProject] = []
    threads = []
    with tempfile.TemporaryDirectory(prefix="refusals-") as tmp:
        for name, (env, server) in variants(Path(tmp)).items():
            work = Path(tmp) / name
            cache = work / "hf"
            (cache / "sparkserve").mkdir(parents=True)
            if name.startswith("guard"):
                (cache / "sparkserve" / "guard-stopped.json").write_text(json.dumps(RECORD))
            project = ComposeProject(
                name=f"sparkserve-refusals-{name}-{os.getpid()}", work=work,
                override={"services": {SERVICE: server}} if server else None,
            )  # fmt: skip
            project.write_env(MODEL_CACHE=str(cache), **env)
            project.remove()
            projects.append(project)
            results[name] = {}
            thread = threading.Thread(target=watch, args=(project, args.minutes, results[name]))
            thread.start()
            threads.append(thread)
        try:
            for thread in threads:
                thread.join()
        finally:
            for project in projects:
                project.remove()
    print(f"{'variant':<12} {'up --wait':<22} {'restarts':>8} {'log lines':>9}  "
          "compose ps at the end / STATUS words seen (2 s samples)")  # fmt: skip
    for name, result in results.items():
        end, up = result["end"], result["up_wait"]
        waited = f"rc {up['rc']} after {up['s']} s"
        seen = result["compose_ps_words"]
        print(f"{name:<12} {waited:<22} {end['restarts']:>8} {end['log_lines']:>9}  "
              f"{end['compose_ps']} / {seen}")  # fmt: skip
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "minutes": args.minutes,
        "results": results,
    }
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
