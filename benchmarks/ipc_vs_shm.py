"""vLLM's CPU workers on a private /dev/shm (`shm_size`, docker-compose.yml's cpu service) against
the host's (`ipc: host`, what the GPU services keep): a start, a request and a drain each way.

The real docker-compose.yml's `cpu` profile on the suite's Docker Engine, the tiny plain model
(HF_OFFLINE=1, in the volume's Hugging Face cache), eager, SHUTDOWN_TIMEOUT_S=15. For each
variant and round: `docker compose up -d --wait` from nothing to healthy (s), a completion
(s), the /dev/shm the container sees while serving (size, used), the user and CapEff of vLLM's
process, then a drain: a streamed completion (up to 1,000 tokens) in flight, `docker compose
stop` timed, whether the stream finished normally and the container's exit status. Needs the
suite's Docker (DOCKER_HOST, Compose v2, the cpu image):

    ./scripts/with_suite_docker.sh env PYTHONPATH=src:tests \\
        python benchmarks/ipc_vs_shm.py --json ipc-vs-shm.json

Prints a line per round and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from support.compose_project import REPO, ComposeProject, install_shims, place_in_hf_cache
from support.cpu_launch import UNPINNED

SERVICE = "sparkserve-cpu"
SHIMS_IN_CONTAINER = "/opt/sparkserve-test-shims"  # the tests' CPU fixes (tests/cpu_shims)
PLAIN_REPO = "sparkserve-bench/tiny-qwen3"
HEALTHY_S = 600
VARIANTS: dict[str, dict[str, Any]] = {
    "shm_size": {},  # docker-compose.yml as it is: shm_size 2gb
    "ipc_host": {"ipc": "host"},  # Docker ignores shm_size with the host's IPC namespace
}


def completion(port: int, max_tokens: int, stream: bool) -> tuple[float, str]:
    """One completion: its seconds and how it ended (a finish reason, or the error)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    started = time.monotonic()
    try:
        if not stream:
            done = client.completions.create(model="tiny", prompt="def add(a, b):",
                                             max_tokens=max_tokens, temperature=0)  # fmt: skip
            return time.monotonic() - started, str(done.choices[0].finish_reason)
        reason = "no finish"
        for chunk in client.completions.create(model="tiny", prompt="def add(a, b):",
                                               max_tokens=max_tokens, stream=True,
                                               temperature=0):  # fmt: skip
            if chunk.choices and chunk.choices[0].finish_reason:
                reason = str(chunk.choices[0].finish_reason)
        return time.monotonic() - started, reason
    except Exception as error:  # how the stream ended is the measurement
        return time.monotonic() - started, f"error: {type(error).__name__}"


def in_container(project: ComposeProject, *argv: str) -> str:
    return project.compose("exec", "-T", SERVICE, *argv, check=False).stdout.strip()


def vllm_status(project: ComposeProject) -> dict[str, str]:
    """Uid and CapEff of the container's vLLM API server, from the host's /proc."""
    procs = project.processes(SERVICE)
    (pid,) = [p for p, argv in procs.items() if " serve " in argv and "vllm" in argv]
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    return {"uid": fields["Uid"].split()[0], "cap_eff": fields["CapEff"]}


def one_round(project: ComposeProject, shims: dict[str, Any], variant: str) -> dict[str, Any]:
    project.override = {"services": {SERVICE: {**shims, **VARIANTS[variant]}}}
    started = time.monotonic()
    project.up(SERVICE, wait_s=HEALTHY_S)
    up_s = time.monotonic() - started
    port = int(project.env["PORT"])
    request_s, request_end = completion(port, 16, stream=False)
    shm = in_container(project, "df", "-B1", "--output=size,used", "/dev/shm").splitlines()[-1]
    ipc = project.inspect(SERVICE)["HostConfig"]["IpcMode"]
    status = vllm_status(project)
    stream: dict[str, Any] = {}

    def run_stream() -> None:
        stream["s"], stream["end"] = completion(port, 1000, stream=True)

    thread = threading.Thread(target=run_stream)
    thread.start()
    time.sleep(1)  # the stream is in flight
    stopped = time.monotonic()
    project.compose("stop", SERVICE, timeout=300)
    stop_s = time.monotonic() - stopped
    thread.join(120)
    state = project.state(SERVICE)
    project.down()
    return {
        "ipc_mode": ipc,
        "up_to_healthy_s": round(up_s, 1),
        "request_s": round(request_s, 2),
        "request_end": request_end,
        "dev_shm_size_used_bytes": [int(x) for x in shm.split()],
        "vllm_uid": status["uid"],
        "vllm_cap_eff": status["cap_eff"],
        "stop_s": round(stop_s, 1),
        "stream_s": round(stream.get("s", -1.0), 1),
        "stream_end": stream.get("end", "(still running)"),
        "exit_code": state["ExitCode"],
    }


def version_of(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("ipc-vs-shm.json"))
    args = parser.parse_args()
    cpu_python = os.environ.get("SPARKSERVE_CPU_PYTHON", sys.executable)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="ipc-vs-shm-") as tmp:
        made = subprocess.run(
            [cpu_python, str(REPO / "tests" / "support" / "tiny_models.py"), f"{tmp}/models"],
            check=True, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        plain = json.loads(made.stdout.strip().splitlines()[-1])["plain"]
        shims = install_shims(cpu_python, Path(tmp) / "shims")
        project = ComposeProject(name=f"sparkserve-ipc-{os.getpid()}", work=Path(tmp) / "compose")
        mounted = {"environment": {"PYTHONPATH": SHIMS_IN_CONTAINER, **UNPINNED},
                   "volumes": [f"{shims}:{SHIMS_IN_CONTAINER}:ro"]}  # fmt: skip
        project.write_env(MODEL=PLAIN_REPO, SERVED_MODEL_NAME="tiny", HF_OFFLINE="1",
                          MAX_MODEL_LEN="2048", KV_CACHE_GB="0.25", OS_RESERVE_GB="4",
                          EXTRA_ARGS="--enforce-eager", SHUTDOWN_TIMEOUT_S="15")  # fmt: skip
        project.remove()
        place_in_hf_cache(project.volume_path("hf-cache") / "hub", PLAIN_REPO, Path(plain))
        try:
            for _ in range(args.rounds):
                for name in VARIANTS:
                    row = one_round(project, mounted, name)
                    results[name].append(row)
                    print(f"{name}: {row}", flush=True)
        finally:
            project.remove()
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "docker": version_of("docker", "version", "--format", "{{.Server.Version}}"),
        "compose": version_of("docker", "compose", "version", "--short"),
        "variants": VARIANTS,
        "results": results,
    }
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
