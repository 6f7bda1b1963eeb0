"""The main job as users run it: the real docker-compose.yml's `cpu` profile, on the `cpu` image
built from the real Dockerfile, on podman (no Docker engine here).

One project, started several times on one model-cache volume holding a tiny hybrid model
(Qwen3.5-style target + DFlash drafter, in Hugging Face cache layout):
  1. a bad knob in .env: the container exits non-zero, one line in its log, nothing listens;
  2. a normal start: healthy through the image's own HEALTHCHECK, then the OpenAI API with the
     default tool and reasoning parsers, API_KEY enforced, prefix-cache hits and speculative
     counters from /metrics, `scripts/stress_mem.sh` PASS and `scripts/bench.sh` from the host
     (both reading the project's .env), `compose down` timed;
  3. a guard trip (a floor above what the machine has): the record lands on the volume and
     the next start refuses (podman here applies no restart policy: the test starts it);
  4. GUARD_RESUME=1 in a recreated container: it clears the record once, starts from the
     cached model and compile cache (timed against 2), and the same container's entrypoint,
     run again as a restart would, refuses a record written later.

What this proves about Docker Compose on a Spark, and what it cannot (podman differs):
  - podman runs no healthcheck on its own (no systemd here): the test runs the image's check
    with `podman healthcheck run`; Docker schedules the same command.
  - podman-compose ignores `depends_on: condition: service_completed_successfully`: here the
    fetch service and the server start together and the server's own fetch step does the
    work; Docker waits for the fetch service first. Both paths run the same fetch.
  - the GPU reservation of the Spark services is not exercised (no GPU; podman would ask for a
    CDI device); the cpu profile has none. The Spark image is not built here (CUDA base image,
    aarch64): its Python stack is checked separately (docs/FINDINGS.md).
  - the test-only vLLM fixes for the CPU (tests/cpu_shims) are mounted in by an override file,
    never built into the image.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.compose_project import REPO, ComposeProject, podman
from support.cpu_launch import UNPINNED
from support.promises import STOP_GRACE_S
from support.vllm_server import metric_sum, parse_metrics

SERVICE = "sparkserve-cpu"
SHIMS_IN_CONTAINER = "/opt/sparkserve-test-shims"
TARGET_REPO = "sparkserve-test/tiny-qwen35"
DRAFTER_REPO = "sparkserve-test/tiny-dflash"
API_KEY = "e2e-secret-key"
HEALTHY_TIMEOUT_S = 600  # two cores shared with the rest of the suite
TIMINGS: dict[str, float] = {}
COMPILE_LINES: dict[str, list[str]] = {}

pytestmark = pytest.mark.skipif(
    not os.environ.get("SPARKSERVE_CPU_IMAGE"),
    reason="SPARKSERVE_CPU_IMAGE is unset: ./scripts/test.sh builds the cpu image with podman "
    "(set SPARKSERVE_CONTAINER_TESTS=0 there to skip it)",
)


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def place_in_hf_cache(hub: Path, repo_id: str, files: Path) -> None:
    """A checkpoint in Hugging Face's cache layout, as `snapshot_download` leaves it."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    digest = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / digest
    shutil.copytree(files, snapshot, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".*"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(digest)


def install_shims(cpu_python: str, target: Path) -> Path:
    subprocess.run(
        [cpu_python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(REPO / "tests" / "cpu_shims")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return target


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
            "environment": {"PYTHONPATH": SHIMS_IN_CONTAINER, **UNPINNED},
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
    )  # fmt: skip
    project.remove()
    hub = project.volume_path("hf-cache") / "hub"
    place_in_hf_cache(hub, TARGET_REPO, Path(tiny_models["target"]))
    place_in_hf_cache(hub, DRAFTER_REPO, Path(tiny_models["dflash"]))
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
    status, body = get(f"http://127.0.0.1:{port_of(project)}/metrics")
    assert status == 200
    return parse_metrics(body.decode())


def compile_lines(log: str) -> list[str]:
    """What vLLM said about compiling (or loading compiled code), for the report."""
    words = ("compil", "Directly load", "AOT")
    return [line[-200:] for line in log.splitlines() if any(w in line for w in words)][:20]


def guard_record(project: ComposeProject) -> Path:
    return project.volume_path("hf-cache") / "sparkserve" / "guard-stopped.json"


def test_1_bad_knob_exits_with_one_line_and_nothing_listens(project: ComposeProject) -> None:
    project.write_env(GPU_MEM="2")
    project.up(SERVICE)
    log = project.wait_for_log(SERVICE, "GPU_MEM='2'", timeout_s=120)
    errors = [line for line in log.splitlines() if "GPU_MEM='2'" in line]
    assert errors[0] == "serve.sh: GPU_MEM='2': must be a number from 0.1 to 0.95", log
    assert "starting vLLM" not in log
    state = project.state(SERVICE)
    assert state["ExitCode"] == 2 or state["Status"] != "exited", state
    assert not listening(port_of(project))
    project.down()
    project.write_env(GPU_MEM="0.5")


def test_1b_a_model_missing_offline_exits_with_one_line(project: ComposeProject) -> None:
    project.write_env(MODEL="sparkserve-test/absent")
    project.up(SERVICE)
    expected = "serve.sh: MODEL=sparkserve-test/absent: HF_OFFLINE=1 and it is not in the cache"
    log = project.wait_for_log(SERVICE, expected, timeout_s=120)
    assert "starting vLLM" not in log
    fetch_log = project.wait_for_log(f"{SERVICE}-fetch", "sparkserve-test/absent", 60)
    assert "sparkserve fetch: MODEL=sparkserve-test/absent: HF_OFFLINE=1" in fetch_log
    assert project.state(f"{SERVICE}-fetch")["ExitCode"] == 4
    assert not listening(port_of(project))
    project.down()
    project.write_env(MODEL=TARGET_REPO)


def test_2_serves_the_api_from_the_cached_model(project: ComposeProject, tmp_path: Path) -> None:
    started = time.monotonic()
    project.up(SERVICE)
    project.wait_healthy(SERVICE, HEALTHY_TIMEOUT_S)
    TIMINGS["up_to_healthy_first_s"] = time.monotonic() - started
    log = project.logs(SERVICE)
    assert f"MODEL {TARGET_REPO}: in the cache" in log and "offline (HF_OFFLINE=1)" in log
    COMPILE_LINES["first"] = compile_lines(log)
    # vLLM's compile cache (VLLM_CACHE_ROOT under HF_HOME) is on the volume, for later starts
    compile_cache = project.volume_path("hf-cache") / "vllm"
    assert any(path.is_file() for path in compile_cache.rglob("*")), "no compile cache kept"
    fetch_log = project.logs(f"{SERVICE}-fetch")
    for repo in (TARGET_REPO, DRAFTER_REPO):
        assert f"{repo}: in the cache" in fetch_log, fetch_log
    assert project.state(f"{SERVICE}-fetch")["ExitCode"] == 0

    from openai import AuthenticationError, OpenAI

    base = f"http://127.0.0.1:{port_of(project)}/v1"
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=base, api_key="wrong-key").models.list()
    assert get(f"{base}/models")[0] == 401
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

    env = dict(os.environ, PYTHON=sys.executable, SPARKSERVE_ENV_FILE=str(project.env_file))
    for knob in project.env:
        env.pop(knob, None)  # the scripts must find PORT, API_KEY, OS_RESERVE_GB in .env
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
    assert result["os_reserve_gib"] == 4.0, "OS_RESERVE_GB comes from the project's .env"

    bench = subprocess.run(
        [str(REPO / "scripts" / "bench.sh"), "--out", str(tmp_path / "bench"),
         "--concurrency", "1,2", "--gen-tokens", "16", "--prefix-tokens", "600",
         "--ttft-rounds", "0"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr[-3000:] + project.logs(SERVICE)[-6000:]
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert report["overall"], report

    TIMINGS["down_s"] = project.down()
    # The promised bound: docker-compose.yml's stop_grace_period, after which the engine
    # SIGKILLs vLLM; a SIGTERM stop ends within it.
    assert TIMINGS["down_s"] < STOP_GRACE_S, TIMINGS
    assert not listening(port_of(project))


def test_3_guard_trip_leaves_a_record_and_the_next_start_refuses(
    project: ComposeProject,
) -> None:
    project.write_env(GUARD_FLOOR_GB="64")  # more than this machine has: trips at once
    project.up(SERVICE)
    log = project.wait_for_log(SERVICE, "the next start refuses until GUARD_RESUME=1", 240)
    assert guard_record(project).is_file(), log
    assert "floor" in guard_record(project).read_text()
    project.down()

    project.write_env(GUARD_FLOOR_GB="")
    project.up(SERVICE)
    log = project.wait_for_log(SERVICE, "the memory guard stopped vLLM last time", 120)
    refusals = {x for x in log.splitlines() if "the memory guard stopped vLLM last time" in x}
    (line,) = refusals  # one line, the same on every start the engine retried
    assert line.startswith("serve.sh: ") and "GUARD_RESUME=1" in line
    assert "starting vLLM" not in log
    assert not listening(port_of(project))
    project.down()


def test_4_guard_resume_is_used_once_and_the_cache_serves_the_second_start(
    project: ComposeProject,
) -> None:
    project.write_env(GUARD_FLOOR_GB="", GUARD_RESUME="1")
    started = time.monotonic()
    project.up(SERVICE)
    project.wait_healthy(SERVICE, HEALTHY_TIMEOUT_S)
    TIMINGS["up_to_healthy_warm_s"] = time.monotonic() - started
    log = project.logs(SERVICE)
    assert "GUARD_RESUME=1: clearing the memory guard record" in log
    assert not guard_record(project).exists()
    assert "downloaded" not in log  # the cache already held every file
    COMPILE_LINES["warm"] = compile_lines(log)

    # A record written later (a second trip) is not cleared when the same container starts its
    # launcher again (what a restart does: same filesystem, same GUARD_RESUME=1). podman cannot
    # restart a container whose compose dependency has exited, so the test runs the entrypoint
    # in it; it must refuse before anything else.
    guard_record(project).write_text(json.dumps({"reason": "a later trip (written by the test)"}))
    again = podman("exec", project.container(SERVICE), "/opt/sparkserve/serve.sh", check=False)
    assert again.returncode == 3, again.stderr
    # (before it the launcher notes the vLLM release's workarounds; podman may warn too)
    (line,) = [x for x in again.stderr.splitlines() if "the memory guard stopped vLLM" in x]
    assert line.startswith("serve.sh: "), again.stderr
    assert "GUARD_RESUME=1 was spent on this container's first start" in line
    assert "a later trip" in line and guard_record(project).is_file()
    TIMINGS["down_s_serving"] = project.down()
    print(f"\ncontainer timings: {json.dumps(TIMINGS)}")
    report = os.environ.get("SPARKSERVE_E2E_REPORT")
    if report:  # the figures docs/FINDINGS.md quotes
        Path(report).write_text(json.dumps({**TIMINGS, **COMPILE_LINES}, indent=1) + "\n")
