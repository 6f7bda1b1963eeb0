"""Who reaches the gate's own /metrics (sparkserve_router_replica_refused): the real gate
process, started with the argv `sparkserve router` gives it (sparkserve.router.command) from
the knobs, API_KEY in its environment. With METRICS_OPEN=0 the gauge wants the key, as every
route but /health; with METRICS_OPEN=1 (the metrics profile's Prometheus without a key) it is
open and every other route still wants the key. No router runs behind it: /metrics is the
gate's own answer (its fleet watch, not yet applied, lists each replica at 0), and the API
routes are refused before anything is passed on."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkserve.client.metrics import parse as parse_metrics
from sparkserve.router.command import gate_argv
from sparkserve.router.settings import router_settings
from sparkserve.router.watch import REFUSED_METRIC
from support.api_calls import call
from support.cpu_launch import cpu_python
from support.vllm_server import LOOPBACK, free_port, tail

KEY = "gate-metrics-key"
WORKERS = "http://127.0.0.1:9,http://localhost:9"  # nothing listens: the watch never applies
START_GUARD_S = 60.0  # the gate answers: a guard against a hang, not a promise


@contextlib.contextmanager
def gate(tmp_path: Path, metrics_open: str) -> Iterator[str]:
    """The gate on a port of its own; its base URL until the block ends."""
    port = str(free_port())
    knobs = {"ROUTER_WORKERS": WORKERS, "HOST": LOOPBACK, "ROUTER_PORT": port,
             "API_KEY": KEY, "METRICS_OPEN": metrics_open}  # fmt: skip
    argv = gate_argv(router_settings(knobs), free_port(), grace_s=1)
    assert KEY not in argv
    log = tmp_path / f"gate-{metrics_open}.log"
    src = Path(__file__).resolve().parents[2] / "src"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [cpu_python(), *argv[1:]], env={"PYTHONPATH": str(src), "API_KEY": KEY},
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    url = f"http://{LOOPBACK}:{port}"
    try:
        deadline = time.monotonic() + START_GUARD_S
        while True:
            try:
                call(url + "/health", None)
                break
            except OSError:
                assert proc.poll() is None, f"the gate exited {proc.returncode}\n{tail(log)}"
                assert time.monotonic() < deadline, f"the gate did not answer\n{tail(log)}"
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def gauges(text: str) -> dict[str, float]:
    return {dict(labels)["worker"]: value for (name, labels), value
            in parse_metrics(text).items() if name == REFUSED_METRIC}  # fmt: skip


@pytest.mark.parametrize("metrics_open", ["0", "1"])
def test_the_gauge_wants_the_key_unless_metrics_open(tmp_path: Path, metrics_open: str) -> None:
    with gate(tmp_path, metrics_open) as url:
        status, text = call(url + "/metrics", KEY)
        assert status == 200, text
        assert gauges(text) == {"http://127.0.0.1:9": 0.0, "http://localhost:9": 0.0}
        for key in (None, "wrong-key"):
            status, text = call(url + "/metrics", key)
            if metrics_open == "1":
                assert (status, gauges(text)) == (200, {"http://127.0.0.1:9": 0.0,
                                                        "http://localhost:9": 0.0})  # fmt: skip
            else:
                assert status == 401, text
            # only /metrics opens: the API still wants the key
            assert call(url + "/v1/models", key)[0] == 401
