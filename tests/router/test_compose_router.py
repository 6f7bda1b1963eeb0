"""Compose's router profile (docker-compose.yml, as Docker Compose v2 reads it): `sparkserve
router` from the same image, no GPU, not root, no capability, back after a reboot, the key as the
server gets it, the API published on BIND_ADDRESS as the server's, its metrics on loopback only,
and Docker's healthcheck on the gate's /health. The replicas' service is not touched by it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkserve.knobs.registry import KNOBS, stop_grace_s
from support.compose_config import compose_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    shutil.copy(REPO / "docker-compose.yml", tmp_path / "docker-compose.yml")
    return tmp_path


def published(service: dict) -> set[tuple[str, str, int]]:
    return {(p["host_ip"], p["published"], p["target"]) for p in service["ports"]}


def router_service(project: Path, env_file: str = "") -> dict:
    (project / ".env").write_text(env_file)
    return compose_config(project, None, "--profile", "router")["services"]["router"]


def test_the_router_is_off_unless_its_profile_is_asked_for(project: Path) -> None:
    assert "router" not in compose_config(project)["services"]


def test_router_runs_sparkserve_router_without_gpu_root_or_capability(project: Path) -> None:
    service = router_service(project)
    assert service["profiles"] == ["router"]
    assert service["entrypoint"] == [
        "python3", "-m", "sparkserve", "router", "--metrics-host", "0.0.0.0",
    ]  # fmt: skip
    assert service["image"] == "sparkserve:spark" and service["build"]["target"] == "spark"
    assert "deploy" not in service and "ipc" not in service and "devices" not in service
    assert service["user"] == "1000:1000"
    assert service["security_opt"] == ["no-new-privileges:true"]
    assert service["cap_drop"] == ["ALL"] and "cap_add" not in service
    assert service["restart"] == "unless-stopped" and service["init"] is True
    assert service.get("network_mode") is None, "its own network: only the ports below show"
    assert service["read_only"] is True and service["tmpfs"] == ["/tmp"]
    assert int(service["mem_limit"]) == 4 * 2**30 and float(service["cpus"]) == 2
    grace = service["stop_grace_period"]
    assert grace in (f"{stop_grace_s()}s", f"{stop_grace_s() // 60}m{stop_grace_s() % 60}s")


def test_router_publishes_the_api_where_the_server_is_and_metrics_on_loopback(
    project: Path,
) -> None:
    assert published(router_service(project)) == {
        ("127.0.0.1", "8001", 8001),
        ("127.0.0.1", "29000", 29000),
    }
    moved = router_service(
        project, "BIND_ADDRESS=0.0.0.0\nROUTER_PORT=9001\nROUTER_METRICS_PORT=9002\n"
    )
    assert published(moved) == {("0.0.0.0", "9001", 9001), ("127.0.0.1", "9002", 9002)}
    health = " ".join(moved["healthcheck"]["test"])
    assert "curl" in health and "http://127.0.0.1:9001/health" in health


def test_router_gets_its_knobs_and_the_key_only_when_set(project: Path) -> None:
    router_knobs = [knob.name for knob in KNOBS if knob.scope == "router"]
    assert set(router_knobs) >= {"ROUTER_WORKERS", "ROUTER_POLICY", "ROUTER_PORT"}
    shared = ["API_KEY", "BIND_ADDRESS", "ALLOWED_HOSTS", "MAX_REQUEST_MB", "METRICS_OPEN"]
    unset = router_service(project)["environment"]
    # a key with no value is passed only when set (compose writes None: nothing is passed)
    assert unset == dict.fromkeys([*router_knobs, *shared])
    text = "API_KEY=k1\nROUTER_WORKERS=http://a:8000\nROUTER_POLICY=round_robin\nMODEL=m\n"
    environment = router_service(project, text)["environment"]
    assert {name: value for name, value in environment.items() if value is not None} == {
        "API_KEY": "k1",
        "ROUTER_WORKERS": "http://a:8000",
        "ROUTER_POLICY": "round_robin",
    }, "the server's model knobs do not reach the router"
    assert "MODEL" not in environment and "HOST" not in environment


def test_router_image_follows_router_image(project: Path) -> None:
    service = router_service(project, "ROUTER_IMAGE=cpu\n")
    assert service["image"] == "sparkserve:cpu" and service["build"]["target"] == "cpu"


def test_the_replicas_service_is_the_same_with_the_router_profile(project: Path) -> None:
    plain = compose_config(project)["services"]["sparkserve"]
    with_router = compose_config(project, None, "--profile", "router")["services"]["sparkserve"]
    assert plain == with_router
