"""`sparkserve doctor` for a pair: two real doctors meeting across two network namespaces
joined by a veth pair (root), a mismatch, an unreachable head, taken ports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import netns
from support.watches import wait_joined, watch_argv

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 60  # --pair-wait of two doctors that meet: they return on meeting; a hang guard


@pytest.fixture()
def pair() -> Iterator[netns.NodePair]:
    with netns.node_pair_or_skip() as made:
        yield made


def doctor_argv(
    pair: netns.NodePair, side: int, wait: float, tmp: Path, **env: str
) -> tuple[list[str], dict[str, str]]:
    knobs = {
        "CLUSTER_NODES": "2", "CLUSTER_RANK": str(side), "CLUSTER_HEAD_ADDR": pair.addresses[0],
        "CLUSTER_IFACE": pair.ifaces[side], "HF_HOME": str(tmp / f"hf{side}"),
    }  # fmt: skip
    full = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SPARKSERVE_IMAGE": "", **knobs, **env}
    command = [sys.executable, "-m", "sparkserve", "doctor", "--json", "--disk-need-gb", "1"]
    return pair.argv(side, [*command, "--pair-wait", f"{wait:g}"]), full


def rows(stdout: str) -> dict[str, dict[str, str]]:
    return {row["name"]: row for row in json.loads(stdout)}


def both(
    pair: netns.NodePair, tmp: Path, head_env: dict[str, str], worker_env: dict[str, str]
) -> tuple[Any, Any]:
    argv, env = doctor_argv(pair, 0, WAIT_S, tmp, **head_env)
    head = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        argv, env = doctor_argv(pair, 1, WAIT_S, tmp, **worker_env)
        worker = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=WAIT_S + 60)
        out, err = head.communicate(timeout=WAIT_S + 60)
    finally:
        if head.poll() is None:
            head.kill()
            head.wait()
    assert err == "" and worker.stderr == "", (err, worker.stderr)
    return (head.returncode, rows(out)), (worker.returncode, rows(worker.stdout))


PAIR_ROWS = ("link", "link addresses", "RDMA devices", "engine ports", "peer", "pair identity",
             "pair link", "pair server")  # fmt: skip


def test_two_doctors_meet_across_the_link(pair: netns.NodePair, tmp_path: Path) -> None:
    (head_code, head), (worker_code, worker) = both(pair, tmp_path, {}, {})
    for found in (head, worker):
        print(json.dumps({k: v for k, v in found.items() if k in PAIR_ROWS}, indent=1))
        assert found["link"]["status"] == "info"  # a veth is up but not a 200 Gb/s ConnectX-7
        assert found["link addresses"]["status"] == "ok"
        assert found["peer"]["status"] == "ok", found["peer"]
        assert found["pair identity"]["status"] == "ok"
        assert found["pair link"]["status"] == "ok"
        assert "ephemeral" in found["engine ports"]["detail"]
    assert f"worker {pair.addresses[1]} reached {pair.addresses[0]}:29501" in head["peer"]["detail"]
    assert "it reached this node's ephemeral port" in worker["peer"]["detail"]
    assert head_code == 0 and worker_code == 0


def test_a_mismatched_pair_names_each_difference(pair: netns.NodePair, tmp_path: Path) -> None:
    pair.set_mtu(0, 9000)
    (head_code, head), (worker_code, worker) = both(pair, tmp_path, {}, {"SPARKSERVE_IMAGE": "cpu"})
    assert head["pair identity"]["status"] == worker["pair identity"]["status"] == "blocker"
    assert (
        head["pair identity"]["detail"] == "the worker runs other code: image: here host, peer cpu"
    )
    assert (
        worker["pair identity"]["detail"] == "the head runs other code: image: here cpu, peer host"
    )
    assert (
        head["pair link"]["status"] == "warn"
        and "MTU here 9000, peer 1500" in head["pair link"]["detail"]
    )
    assert head["peer"]["status"] == "ok"  # the link itself works
    assert head_code == worker_code == 1


def test_an_unreachable_head_is_one_line(pair: netns.NodePair, tmp_path: Path) -> None:
    argv, env = doctor_argv(pair, 1, 2, tmp_path)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    peer = rows(done.stdout)["peer"]
    assert done.returncode == 1 and peer["status"] == "blocker"
    assert peer["detail"].startswith(
        f"the head {pair.addresses[0]}:29501 not reachable within 2 s: connection refused"
    )
    assert "\n" not in peer["detail"]
    # an address nobody on the link has: no answer, the same row, still bounded
    argv, env = doctor_argv(pair, 1, 2, tmp_path, CLUSTER_HEAD_ADDR=str(pair.subnet[200]))
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert rows(done.stdout)["peer"]["detail"].startswith(
        f"the head {pair.subnet[200]}:29501 not reachable within 2 s: "
    )
    # a link that is down stops the check before any connection, in the launcher's words
    pair.set_link(0, up=False)
    pair.wait_carrier(pair.namespaces[1], pair.ifaces[1], up=False)  # the far end sees it
    argv, env = doctor_argv(pair, 1, 2, tmp_path)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    found = rows(done.stdout)
    assert found["link"]["status"] == "blocker"
    assert found["link"]["detail"] == (
        f"CLUSTER_IFACE={pair.ifaces[1]!r}: the interface is up but has no link (no carrier: "
        "check the cable and the other machine's port)"
    )
    assert found["peer"]["status"] == "skip"
    # the head waits for a worker as long as it was told, then says what to do
    pair.set_link(0, up=True)
    argv, env = doctor_argv(pair, 0, 2, tmp_path)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert rows(done.stdout)["peer"]["detail"].startswith(
        f"no worker doctor reached {pair.addresses[0]}:29501 and :29510 within 2 s"
    )


def _serve_in(pair: netns.NodePair, side: int, code: str) -> subprocess.Popen[str]:
    """A small server (Python source) run inside a namespace; prints "ready" when listening."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    server = subprocess.Popen(
        pair.argv(side, [sys.executable, "-c", code]), env=env, stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    return server


def _watch_in(pair: netns.NodePair, side: int, tmp: Path) -> subprocess.Popen[str]:
    """The real pair watch of `side`, guarding a sleeping process that stands for vLLM."""
    guarded = pair.argv(side, ["sleep", "120"])
    served = subprocess.Popen(guarded)
    argv = watch_argv(served.pid, side, pair.addresses[0], pair.addresses[side], 29510,
                      tmp / f"watch-{side}.json")  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    return subprocess.Popen(pair.argv(side, argv), env=env, stderr=subprocess.PIPE, text=True)


ENGINE_PORT_HOLDER = """
import socket, time
held = socket.create_server(("{head}", 29501))  # where the engine's rendezvous listens
print("ready", flush=True)
time.sleep(120)
"""


def doctor_rows(pair: netns.NodePair, side: int, tmp: Path) -> dict[str, dict[str, str]]:
    argv, env = doctor_argv(pair, side, 5, tmp)
    return rows(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60).stdout)


def test_a_running_pair_is_probed_instead(pair: netns.NodePair, tmp_path: Path) -> None:
    engine = _serve_in(pair, 0, ENGINE_PORT_HOLDER.format(head=pair.addresses[0]))
    watches = [_watch_in(pair, side, tmp_path) for side in (0, 1)]
    try:
        wait_joined(tmp_path / "watch-0.json", watches)
        head, worker = doctor_rows(pair, 0, tmp_path), doctor_rows(pair, 1, tmp_path)
    finally:
        for process in (engine, *watches):
            process.kill()
            process.wait()
    assert head["pair server"]["status"] == "ok"
    assert (
        "the pair's server runs here (its watch answered; the worker has joined)"
        in head["pair server"]["detail"]
    )
    assert "pair identity" not in head  # the same code: nothing to say
    assert worker["peer"]["status"] == "ok" and "the head's server runs" in worker["peer"]["detail"]
    assert worker["pair identity"]["status"] == "ok"


PORT_HOLDER = """
import socket, time
held = socket.create_server(("{head}", 29501))
print("ready", flush=True)
time.sleep(120)
"""


def test_a_port_taken_by_another_program_is_a_blocker(pair: netns.NodePair, tmp_path: Path) -> None:
    code = PORT_HOLDER.format(head=pair.addresses[0])
    server = _serve_in(pair, 0, code)
    try:
        head = doctor_rows(pair, 0, tmp_path)
    finally:
        server.kill()
        server.wait()
    assert head["pair server"]["status"] == "blocker"
    assert head["pair server"]["detail"].startswith(
        f"{pair.addresses[0]}:29501 is taken and no pair watch answers"
    )
