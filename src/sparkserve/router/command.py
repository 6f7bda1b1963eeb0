"""The two processes `sparkserve router` runs: vllm-router on loopback and the key gate in front.

Each is the same Python as `sparkserve` itself (the image's, with vllm-router from its lock). The
key reaches the gate through its environment (API_KEY), never its command line; vllm-router
gets none (it checks no client key: the gate does, and each replica again).
"""

from __future__ import annotations

import sys

from sparkserve.router.settings import RouterSettings

LOOPBACK = "127.0.0.1"
ROUTER_PORT = 30000  # vllm-router's own default: on loopback, never published
# A health check that hangs longer than this counts as failed: a replica that is up answers
# /health in milliseconds (vllm-router's default is 5 s).
HEALTH_TIMEOUT_S = 3
HEALTH_SUCCESSES = 2  # checks in a row that bring a replica back (vllm-router's default)
# A request that fails on a replica (a 5xx, or no connection) is tried again, up to ATTEMPTS in
# all, each attempt picked again by the policy among the replicas in rotation. cache_aware picks
# a replica that just died again and again (its requests end at once: it is the least loaded),
# so until the health checks take it out a request could spend every attempt on it and fail
# (seen with vllm-router's circuit breaker at its default of 10 failures in a row:
# tests/e2e/test_router_fleet.py). With the breaker open after CIRCUIT_FAILURES in a row, the
# replica leaves rotation within one request's attempts and the last ones go to the others.
ATTEMPTS = 5  # vllm-router's default, stated: CIRCUIT_FAILURES must stay below it
CIRCUIT_FAILURES = 3


def upstream(router_port: int) -> str:
    return f"http://{LOOPBACK}:{router_port}"


def router_argv(settings: RouterSettings, router_port: int, metrics_host: str) -> list[str]:
    """vllm-router's launcher (the wheel's `vllm-router` console script) with the knobs."""
    interval = str(settings.health_interval_s)
    return [
        sys.executable, "-m", "vllm_router.launch_router",
        "--host", LOOPBACK,
        "--port", str(router_port),
        "--worker-urls", *settings.workers,
        "--policy", settings.policy,
        "--health-check-interval-secs", interval,
        "--health-failure-threshold", str(settings.health_failures),
        "--health-success-threshold", str(HEALTH_SUCCESSES),
        "--health-check-timeout-secs", str(HEALTH_TIMEOUT_S),
        "--health-check-endpoint", "/health",
        "--retry-max-retries", str(ATTEMPTS),
        "--cb-failure-threshold", str(CIRCUIT_FAILURES),
        # at start it waits for one replica's /health: ask as often as the health checks do
        "--worker-startup-check-interval", interval,
        "--prometheus-host", metrics_host,
        "--prometheus-port", str(settings.metrics_port),
        "--log-level", "info",
    ]  # fmt: skip


def gate_argv(settings: RouterSettings, router_port: int, grace_s: int) -> list[str]:
    return [
        sys.executable, "-m", "sparkserve.router.gate",
        "--host", settings.host,
        "--port", str(settings.port),
        "--upstream", upstream(router_port),
        "--max-request-mb", str(settings.max_request_mb),
        "--allowed-hosts", settings.allowed_hosts,
        "--grace-s", str(grace_s),
        "--workers", ",".join(settings.workers),
        "--fleet-check-s", str(settings.fleet_check_s),
        "--metrics-open", "1" if settings.metrics_open else "0",
    ]  # fmt: skip
