"""Both hosts' memory in a stress run on a pair, read over real sockets from a small TCP server
that speaks the pair's wire protocol as the head's watch does (the real watch meets this code
in the lead's integration test)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkserve.cluster import wire
from sparkserve.stress.pair_memory import PairWatch, readings_of, table, watch_for, with_pair
from sparkserve.stress.verdict import Verdict
from support.vllm_server import free_port
from support.watch_stand_in import WatchStandIn, about, pair_env
from support.watches import read_state, watch_argv


@pytest.fixture()
def stand_in(request: pytest.FixtureRequest) -> Iterator[WatchStandIn]:
    server = WatchStandIn(request.param)
    yield server
    server.close()


SCRIPT = [about(30.0, 40.0), about(25.0, 12.0, 0.5), about(28.0, 9.5, 1.0), about(29.0, 20.0, 1.0)]


@pytest.mark.parametrize("stand_in", [SCRIPT], indirect=True)
def test_each_host_keeps_its_lowest_memory_and_its_swap(stand_in: WatchStandIn) -> None:
    clock = iter(range(100))
    found, note = watch_for(pair_env(stand_in.port), lambda: float(next(clock)))
    assert found is not None and note == ""
    watch = found
    watch.period_s = 0.05
    watch.start()
    deadline = time.monotonic() + 60  # a guard against a hang: 5 readings take 0.25 s
    while watch.hosts["1"].readings < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    assert watch.hosts["1"].readings >= 5, "the watch stopped reading the worker"
    assert stand_in.asked[0]["kind"] == "probe"
    assert wire.Nonces().problem(stand_in.asked[0], wire.secret_of()) is None, "signed"
    report = watch.report(reserve_gib=10.0, swap_tolerance_gib=0.0)
    head, worker = report["hosts"]["head"], report["hosts"]["worker"]
    assert head["min_available_gib"] == 25.0 and head["swap_growth_gib"] == 0.0
    # the first probe (watch_for's check) is not a reading: the run's readings start at t=0
    assert worker["min_available_gib"] == 9.5 and worker["min_available_t"] == 1.0
    assert worker["swap_first_gib"] == 0.5 and worker["swap_peak_gib"] == 1.0
    assert report["problems"] == [
        "the worker's MemAvailable fell to 9.50 GiB, under the OS reserve of 10 GiB, at t=1.0 s"
    ]
    json.dumps(report)  # the stress JSON carries it as is
    printed = table(report).splitlines()
    assert printed[1].split()[:3] == ["head", str(head["readings"]), "25.00"]
    assert printed[2].split()[:3] == ["worker", str(worker["readings"]), "9.50"]
    assert "0.50 -> 1.00 GiB" in printed[2]
    # with the run's own verdict: the worker's floor fails a run that passed on this host
    passed = Verdict(True, "PASS: swap did not grow ...", 1.0, "c=1", 30.0, 0.0)
    failed = with_pair(passed, report)
    assert not failed.passed and failed.line.startswith("FAIL: the worker's MemAvailable fell")
    # swap growth alone fails too, and a pair that stayed above its floors passes
    assert watch.report(5.0, 0.0)["problems"] == ["the worker's swap grew by 512 MiB"]
    assert watch.report(5.0, 1.0)["problems"] == []
    kept = with_pair(passed, watch.report(5.0, 1.0))
    assert kept.passed and kept.line.endswith(
        "lowest MemAvailable: head 25.00 GiB and worker 9.50 GiB"
    )


def test_an_unreachable_watch_is_one_line() -> None:
    port = free_port()
    watch, note = watch_for(pair_env(port), time.monotonic)
    assert watch is None
    assert note.startswith(f"the pair watch at 127.0.0.1:{port} did not answer (")
    assert note.endswith("): judging this host alone") and "\n" not in note
    assert watch_for({}, time.monotonic) == (None, "")  # one Spark: nothing to poll


@pytest.mark.parametrize(
    "stand_in", [[b"HTTP/1.1 400 Bad Request\r\n\r\n", about(30.0, None), {"kind": "bye"}]],
    indirect=True,
)  # fmt: skip
def test_a_watch_that_answers_nonsense_or_lacks_a_host(stand_in: WatchStandIn) -> None:
    watch, note = watch_for(pair_env(stand_in.port), time.monotonic)
    assert watch is None and "not a sparkserve message" in note
    watch = PairWatch("127.0.0.1", stand_in.port, lambda: 0.0)
    watch.poll()  # the head alone: the worker has not joined
    watch.poll()  # a message of another kind: counted, kept, not raised
    report = watch.report(1.0, 0.0)
    assert report["failed_probes"] == 1 and "not an about" in report["last_error"]
    assert report["problems"] == ["the watch never reported the worker's memory"]
    assert "1 probes of 127.0.0.1" in table(report)
    with pytest.raises(wire.WireError, match="rank 1's reading is not one"):
        readings_of({"kind": "about", "memory": {"1": {"available_gib": "x"}}})


def test_the_probe_proves_the_secret_of_the_tools_knobs(tmp_path: Path) -> None:
    """A real head watch with CLUSTER_SECRET set: stress (and doctor) take the secret from the
    knobs they read (.env's among them, not this process's environment) and are answered; with
    another secret, the watch refuses and stress judges this host alone, saying why."""
    secret = "stress-secret-0123456789"
    port = free_port()
    tree = subprocess.Popen(["sleep", "300"])
    argv = watch_argv(tree.pid, 0, "127.0.0.1", "127.0.0.1", port, tmp_path / "state.json")
    env = {**os.environ, "CLUSTER_SECRET": secret}
    head = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while "waiting" not in read_state(tmp_path / "state.json"):
            assert time.monotonic() < deadline and head.poll() is None, "the watch did not start"
            time.sleep(0.1)
        for _ in range(100):  # listening a moment after it wrote its state
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            time.sleep(0.1)
        watch, note = watch_for({**pair_env(port), "CLUSTER_SECRET": secret}, time.monotonic)
        assert watch is not None and note == ""
        watch, note = watch_for({**pair_env(port), "CLUSTER_SECRET": "x" + secret}, time.monotonic)
        assert watch is None and wire.NO_PROOF in note, note
    finally:
        for proc in (head, tree):
            proc.kill()
            proc.wait()
    assert "refused a probe from 127.0.0.1: no valid proof of CLUSTER_SECRET" in head.stderr.read()
