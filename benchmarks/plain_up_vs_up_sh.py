"""What a changed .env does to a running server: a plain `docker compose up -d` against
`scripts/up.sh`, with a value only this machine refuses.

The real docker-compose.yml's `cpu` profile on the suite's Docker Engine: a healthy server of
the tiny plain model (HF_OFFLINE=1, the model in the volume's Hugging Face cache), then for
each change in turn, each first through `scripts/up.sh`, then through a plain `up -d`:
  - budget: GPU_MEM=0.95 with OS_RESERVE_GB=64 (every range passes; the memory does not);
  - model: MODEL naming a repo the cache lacks (what a typo in a name does offline).
Measured for each command: its exit status and seconds, its last line, whether the server's
container is the same one afterwards, whether the API answers (/v1/models, every second for
--watch-s), and the server container's state, restarts and `docker compose ps` status at the
end. Between the two, the server is brought back (the original .env, `up -d --wait`). Needs the
suite's Docker (DOCKER_HOST, Compose v2, the cpu image):

    ./scripts/with_suite_docker.sh env PYTHONPATH=src:tests \\
        python benchmarks/plain_up_vs_up_sh.py --json plain-up.json

Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from support.compose_project import REPO, ComposeProject, install_shims, place_in_hf_cache
from support.cpu_launch import UNPINNED

SERVICE = "sparkserve-cpu"
SHIMS_IN_CONTAINER = "/opt/sparkserve-test-shims"  # the tests' CPU fixes (tests/cpu_shims)
PLAIN_REPO = "sparkserve-bench/tiny-qwen3"
HEALTHY_S = 600
CHANGES: dict[str, dict[str, str]] = {
    "budget": {"GPU_MEM": "0.95", "OS_RESERVE_GB": "64"},
    "model": {"MODEL": "sparkserve-bench/absent"},
}


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=3) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def compose_status(project: ComposeProject) -> str:
    done = project.compose("ps", "-a", "--format", "{{.Service}}\t{{.Status}}", check=False)
    rows = dict(line.split("\t", 1) for line in done.stdout.splitlines() if "\t" in line)
    return rows.get(SERVICE, "(not listed)")


def container_id(project: ComposeProject) -> str:
    try:
        return str(project.inspect(SERVICE)["Id"])
    except RuntimeError:
        return ""


def apply(project: ComposeProject, how: str, watch_s: float) -> dict[str, Any]:
    """One changed .env applied by `how` (up.sh or plain), then the API watched."""
    port = int(project.env["PORT"])
    before = container_id(project)
    command = (
        [str(REPO / "scripts" / "up.sh"), SERVICE]
        if how == "up.sh"
        else ["docker", "compose", "up", "-d", SERVICE]  # as a user types it
    )
    started = time.monotonic()
    done = subprocess.run(command, env=project.script_env(), capture_output=True, text=True,
                          timeout=600, cwd=REPO)  # fmt: skip
    took = time.monotonic() - started
    answered = []
    watch_from = time.monotonic()
    while time.monotonic() - watch_from < watch_s:
        answered.append(answers(port))
        time.sleep(1)
    inspect = project.inspect(SERVICE) if container_id(project) else {}
    return {
        "rc": done.returncode,
        "s": round(took, 1),
        "last_line": (done.stderr.strip().splitlines() or [""])[-1][-200:],
        "same_container": container_id(project) == before,
        "api_answered_s": sum(answered),
        "watched_s": len(answered),
        "state": inspect.get("State", {}).get("Status", "(none)"),
        "restarts": inspect.get("RestartCount"),
        "compose_ps": compose_status(project),
    }


def version_of(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watch-s", type=float, default=30.0)
    parser.add_argument("--json", type=Path, default=Path("plain-up.json"))
    args = parser.parse_args()
    cpu_python = os.environ.get("SPARKSERVE_CPU_PYTHON", sys.executable)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="plain-up-") as tmp:
        made = subprocess.run(
            [cpu_python, str(REPO / "tests" / "support" / "tiny_models.py"), f"{tmp}/models"],
            check=True, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        plain = json.loads(made.stdout.strip().splitlines()[-1])["plain"]
        shims = install_shims(cpu_python, Path(tmp) / "shims")
        project = ComposeProject(
            name=f"sparkserve-plain-up-{os.getpid()}", work=Path(tmp) / "compose",
            override={"services": {SERVICE: {
                "environment": {"PYTHONPATH": SHIMS_IN_CONTAINER, **UNPINNED},
                "volumes": [f"{shims}:{SHIMS_IN_CONTAINER}:ro"],
            }}},
        )  # fmt: skip
        base = {"MODEL": PLAIN_REPO, "SERVED_MODEL_NAME": "tiny", "HF_OFFLINE": "1",
                "MAX_MODEL_LEN": "2048", "KV_CACHE_GB": "0.25", "OS_RESERVE_GB": "4",
                "EXTRA_ARGS": "--enforce-eager"}  # fmt: skip
        project.write_env(**base)
        project.remove()
        place_in_hf_cache(project.volume_path("hf-cache") / "hub", PLAIN_REPO, Path(plain))
        try:
            for name, change in CHANGES.items():
                for how in ("up.sh", "plain"):
                    project.unset_env(*(k for c in CHANGES.values() for k in c if k not in base))
                    project.write_env(**base)
                    if "PORT" not in project.env or not answers(int(project.env["PORT"])):
                        project.up(SERVICE, wait_s=HEALTHY_S)  # picks a free PORT
                    project.write_env(**change)
                    results[f"{name}/{how}"] = apply(project, how, args.watch_s)
                    print(f"{name}/{how}: {results[f'{name}/{how}']}", flush=True)
        finally:
            project.remove()
    print(f"{'change/how':<14} {'rc':>3} {'s':>6} {'same':>5} {'API s':>6}  end state / ps")
    for key, row in results.items():
        print(f"{key:<14} {row['rc']:>3} {row['s']:>6} {row['same_container']!s:>5} "
              f"{row['api_answered_s']:>3}/{row['watched_s']:<3} {row['state']} / "
              f"{row['compose_ps']}")  # fmt: skip
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "docker": version_of("docker", "version", "--format", "{{.Server.Version}}"),
        "compose": version_of("docker", "compose", "version", "--short"),
        "watch_s": args.watch_s,
        "changes": CHANGES,
        "results": results,
    }
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
