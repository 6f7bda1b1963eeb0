"""The pair's link knobs, checked against this machine's real interfaces.

Each check runs `sparkserve knobs resolve` inside a pair of network namespaces (root only):
the interfaces, addresses and carrier states are real, and so is the one line on a refusal."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkserve.cluster.link import cluster_exports
from sparkserve.launch.shell import read_records
from support import netns

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def pair() -> Iterator[netns.NodePair]:
    with netns.node_pair_or_skip() as made:
        yield made


def test_one_node_needs_no_link() -> None:
    one = {"CLUSTER_NODES": "1", "CLUSTER_IFACE": "nonesuch", "CLUSTER_HEAD_ADDR": ""}
    assert cluster_exports(one) == {"CLUSTER_HOST_IP": ""}


def _resolve_in(
    pair: netns.NodePair, namespace: str, **knobs: str
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"], "PYTHONPATH": str(SRC), "GPU_MEM": "0.3",
        "OS_RESERVE_GB": "4", "CLUSTER_NODES": "2", **knobs,
    }  # fmt: skip
    argv = ["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "sparkserve",
            "knobs", "resolve", "--launcher", "dflash", "--prog", "serve.sh",
            "--pid", "1"]  # fmt: skip
    return pair.run(namespace, *argv, check=False)


def _command(plan: object) -> subprocess.CompletedProcess[str]:
    """The launcher's second step, outside the namespaces: it reads only the plan."""
    assert isinstance(plan, str)
    return subprocess.run(
        [sys.executable, "-m", "sparkserve", "knobs", "command", "--prog", "serve.sh"],
        input=plan, env={"PATH": os.environ["PATH"], "PYTHONPATH": str(SRC)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _variables(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """What the launcher's set_variables reads from the step's output."""
    assert done.returncode == 0, done.stderr
    return dict(read_records(done.stdout.encode()))


def _head(pair: netns.NodePair, **knobs: str) -> subprocess.CompletedProcess[str]:
    return _resolve_in(pair, pair.head, **{"CLUSTER_RANK": "0",
                       "CLUSTER_HEAD_ADDR": pair.head_ip, "CLUSTER_IFACE": pair.head_if,
                       **knobs})  # fmt: skip


def test_the_head_and_the_worker_find_their_address_on_the_link(pair: netns.NodePair) -> None:
    head = _variables(_head(pair, CLUSTER_JOIN_TIMEOUT_S="600.5"))
    assert head["CLUSTER_HOST_IP"] == pair.head_ip
    assert "--host-ip" in head["WATCH_ARGS"]  # type: ignore[operator]
    command = _variables(_command(head["LAUNCH_PLAN"]))
    argv = command["VLLM_ARGS"]
    assert isinstance(argv, list)
    assert argv[argv.index("--distributed-timeout-seconds") + 1] == "601"
    assert f"VLLM_HOST_IP={pair.head_ip}" in command["VLLM_ENV"]  # type: ignore[operator]
    worker = _variables(
        _resolve_in(
            pair,
            pair.worker,
            CLUSTER_RANK="1",
            CLUSTER_HEAD_ADDR=pair.head_ip,
            CLUSTER_IFACE=pair.worker_if,
        )
    )
    assert worker["CLUSTER_HOST_IP"] == pair.worker_ip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"CLUSTER_HEAD_ADDR": ""}, "CLUSTER_HEAD_ADDR is empty: required with CLUSTER_NODES=2"),
        ({"CLUSTER_IFACE": ""}, "CLUSTER_IFACE='': required with CLUSTER_NODES=2"),
        ({"CLUSTER_HEAD_ADDR": "300.1.2.3"},
         "CLUSTER_HEAD_ADDR='300.1.2.3': must be an IPv4 address"),
        ({"CLUSTER_HEAD_ADDR": "224.0.0.1"}, "not unspecified, multicast or broadcast"),
        ({"CLUSTER_IFACE": "eth9x"}, "CLUSTER_IFACE='eth9x': no such interface here (have: "),
        ({"CLUSTER_RANK": "1", "CLUSTER_HEAD_ADDR": "10.9.0.1"},
         "CLUSTER_HEAD_ADDR='10.9.0.1' is not in the network of CLUSTER_IFACE="),
        ({"CLUSTER_HEAD_ADDR": "{worker_ip}"},
         "on the head it must be an address of CLUSTER_IFACE"),
        ({"CLUSTER_RANK": "1"}, "on the worker it must be the head's address"),
        ({"CLUSTER_WATCH_PORT": "29501"},
         "CLUSTER_WATCH_PORT='29501': the same port as CLUSTER_PORT"),
        ({"PORT": "29510"}, "PORT='29510': the same port as CLUSTER_WATCH_PORT"),
    ],
)  # fmt: skip
def test_each_bad_link_knob_is_one_line(
    pair: netns.NodePair, change: dict[str, str], message: str
) -> None:
    knobs = {name: value.format(worker_ip=pair.worker_ip) for name, value in change.items()}
    refused = _head(pair, **knobs)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.count("\n") == 1 and message in refused.stderr, refused.stderr


def test_a_down_interface_and_one_without_an_address_are_refused() -> None:
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    with netns.node_pair() as pair:
        ok = _variables(
            _resolve_in(
                pair,
                pair.worker,
                CLUSTER_RANK="1",
                CLUSTER_HEAD_ADDR=pair.head_ip,
                CLUSTER_IFACE=pair.worker_if,
            )
        )
        assert ok["CLUSTER_HOST_IP"] == pair.worker_ip
        pair.cut(pair.head)
        down = _resolve_in(pair, pair.head, CLUSTER_HEAD_ADDR=pair.head_ip,
                           CLUSTER_IFACE=pair.head_if)  # fmt: skip
        assert (down.returncode, down.stdout) == (2, "")
        assert down.stderr == (
            f"serve.sh: CLUSTER_IFACE='{pair.head_if}': the interface is down (bring it up: "
            f"ip link set {pair.head_if} up)\n"
        )
        pair.wait_carrier(pair.worker, pair.worker_if, up=False)
        cable = _resolve_in(pair, pair.worker, CLUSTER_RANK="1", CLUSTER_HEAD_ADDR=pair.head_ip,
                            CLUSTER_IFACE=pair.worker_if)  # fmt: skip
        assert cable.stderr == (
            f"serve.sh: CLUSTER_IFACE='{pair.worker_if}': the interface is up but has no link "
            "(no carrier: check the cable and the other machine's port)\n"
        )
        pair.run(pair.head, "ip", "link", "set", pair.head_if, "up")
        pair.wait_carrier(pair.worker, pair.worker_if)
        pair.run(pair.worker, "ip", "addr", "flush", "dev", pair.worker_if)
        bare = _resolve_in(pair, pair.worker, CLUSTER_RANK="1", CLUSTER_HEAD_ADDR=pair.head_ip,
                           CLUSTER_IFACE=pair.worker_if)  # fmt: skip
        assert bare.returncode == 2
        assert bare.stderr.startswith(
            f"serve.sh: CLUSTER_IFACE='{pair.worker_if}' has no IPv4 address: give it one"
        )
        assert bare.stderr.count("\n") == 1
