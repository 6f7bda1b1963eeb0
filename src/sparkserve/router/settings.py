"""What `sparkserve router` runs with: the router knobs and the shared access knobs, each
checked by the registry's own rule (one line naming the knob, value and rule on a bad one)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sparkserve.knobs.registry import BY_NAME, IMAGE_ENV, KNOBS, KnobError
from sparkserve.launch.settings import is_loopback
from sparkserve.launch.vllm_command import WILDCARDS
from sparkserve.router.workers import parse_workers

# The server's knobs the router applies alike: the key, where it binds (HOST inside its
# container or on a host; compose publishes BIND_ADDRESS), the Host names it answers to, the
# largest body it takes and whether /metrics (the gate's own) is open without the key.
SHARED = ("API_KEY", "HOST", "BIND_ADDRESS", "ALLOWED_HOSTS", "MAX_REQUEST_MB", "METRICS_OPEN")


@dataclass(frozen=True)
class RouterSettings:
    workers: tuple[str, ...]
    policy: str
    port: int
    metrics_port: int
    health_interval_s: int
    health_failures: int
    fleet_check_s: int
    host: str
    api_key: str
    allowed_hosts: str  # SPARKSERVE_ALLOWED_HOSTS for the gate's access rule ("*": any)
    max_request_mb: int
    metrics_open: bool  # the gate's /metrics without the key (METRICS_OPEN=1)


def _checked(env: Mapping[str, str]) -> dict[str, str]:
    names = [knob.name for knob in KNOBS if knob.scope == "router"] + list(SHARED)
    return {name: BY_NAME[name].check(env.get(name, BY_NAME[name].default)) for name in names}


def router_settings(env: Mapping[str, str]) -> RouterSettings:
    """The settings from the environment (a knob unset takes the registry's default), or
    KnobError: ROUTER_WORKERS empty, any knob outside its rule, or the API opened beyond this
    machine without API_KEY (the launcher's own rule, applied to BIND_ADDRESS and, outside a
    container, to HOST)."""
    text = _checked(env)
    if not text["ROUTER_WORKERS"]:
        raise KnobError(
            "ROUTER_WORKERS is empty: name each replica, e.g. "
            "ROUTER_WORKERS=http://spark-1:8000,http://spark-2:8000"
        )
    if not text["API_KEY"]:
        bind = text["BIND_ADDRESS"]
        if not is_loopback(bind):
            raise KnobError(
                f"BIND_ADDRESS={bind!r} publishes the router beyond this machine without "
                "API_KEY: set API_KEY (every client then sends it), or BIND_ADDRESS=127.0.0.1"
            )
        if IMAGE_ENV not in env and not is_loopback(text["HOST"]):
            raise KnobError(
                f"HOST={text['HOST']!r} binds the router beyond this machine without API_KEY "
                "(a run on the host, not in a container): set HOST=127.0.0.1, or API_KEY"
            )
    if text["ALLOWED_HOSTS"] == "*":
        hosts = "*"
    else:
        names = [text["BIND_ADDRESS"], text["HOST"], *text["ALLOWED_HOSTS"].split(",")]
        hosts = ",".join(dict.fromkeys(n for n in names if n not in WILDCARDS))
    return RouterSettings(
        workers=tuple(parse_workers(text["ROUTER_WORKERS"])),
        policy=text["ROUTER_POLICY"],
        port=int(text["ROUTER_PORT"]),
        metrics_port=int(text["ROUTER_METRICS_PORT"]),
        health_interval_s=int(text["ROUTER_HEALTH_INTERVAL_S"]),
        health_failures=int(text["ROUTER_HEALTH_FAILURES"]),
        fleet_check_s=int(text["ROUTER_FLEET_CHECK_S"]),
        host=text["HOST"],
        api_key=text["API_KEY"],
        allowed_hosts=hosts,
        max_request_mb=int(text["MAX_REQUEST_MB"]),
        metrics_open=text["METRICS_OPEN"] == "1",
    )
