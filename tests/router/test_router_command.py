"""The two command lines `sparkserve router` starts (sparkserve.router.command): vllm-router on
loopback with the knobs, parsed back by vllm-router's own argument parser (the wheel's, from the
cpu-serve venv), and the gate with no key on its command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sparkserve.router.command import gate_argv, router_argv
from sparkserve.router.settings import router_settings

SETTINGS = router_settings(
    {
        "ROUTER_WORKERS": "http://a:8000,http://b:8000",
        "ROUTER_POLICY": "round_robin",
        "API_KEY": "secret-key",
        "HOST": "127.0.0.1",
    }
)
PARSE = """
import argparse, json, sys
from vllm_router.launch_router import RouterArgs
parser = argparse.ArgumentParser()
RouterArgs.add_cli_args(parser)
args = RouterArgs.from_cli_args(parser.parse_args(sys.argv[1:]))
print(json.dumps({k: getattr(args, k) for k in (
    "host", "port", "worker_urls", "policy", "health_check_interval_secs",
    "health_failure_threshold", "health_success_threshold", "health_check_timeout_secs",
    "worker_startup_check_interval", "prometheus_host", "prometheus_port", "api_key",
    "retry_max_retries", "cb_failure_threshold")}))
"""


def test_vllm_router_reads_the_knobs_as_meant(cpu_venv_python: str) -> None:
    argv = router_argv(SETTINGS, 30123, "0.0.0.0")
    assert argv[:3] == [sys.executable, "-m", "vllm_router.launch_router"]
    done = subprocess.run(
        [cpu_venv_python, "-c", PARSE, *argv[3:]],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "host": "127.0.0.1",
        "port": 30123,
        "worker_urls": ["http://a:8000", "http://b:8000"],
        "policy": "round_robin",
        "health_check_interval_secs": 2,
        "health_failure_threshold": 2,
        "health_success_threshold": 2,
        "health_check_timeout_secs": 3,
        "worker_startup_check_interval": 2,
        "prometheus_host": "0.0.0.0",
        "prometheus_port": 29000,
        "api_key": None,
        "retry_max_retries": 5,
        "cb_failure_threshold": 3,
    }


@pytest.mark.parametrize("argv", [router_argv(SETTINGS, 30123, "127.0.0.1"),
                                  gate_argv(SETTINGS, 30123, 50)])  # fmt: skip
def test_no_key_on_a_command_line(argv: list[str]) -> None:
    assert not any("secret-key" in arg for arg in argv)


def test_the_gate_listens_where_the_server_would_and_forwards_to_loopback() -> None:
    argv = gate_argv(SETTINGS, 30123, 50)
    options = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert argv[:3] == [sys.executable, "-m", "sparkserve.router.gate"]
    assert options == {
        "--host": "127.0.0.1",
        "--port": "8001",
        "--upstream": "http://127.0.0.1:30123",
        "--max-request-mb": "8",
        "--allowed-hosts": "127.0.0.1",
        "--grace-s": "50",
        "--workers": "http://a:8000,http://b:8000",
        "--fleet-check-s": "30",
        "--metrics-open": "0",
    }
    opened = router_settings({"ROUTER_WORKERS": "http://a:8000", "HOST": "127.0.0.1",
                              "METRICS_OPEN": "1"})  # fmt: skip
    assert gate_argv(opened, 30123, 50)[-2:] == ["--metrics-open", "1"]
