"""The pair's link knobs, checked against this machine's real interfaces.

Each check runs the launcher's start step (`sparkserve start`, DRY_RUN=1: the command printed,
nothing started) inside a pair of network namespaces (root only): the interfaces, addresses and
carrier states are real, and so is the one line on a refusal."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkserve.cluster.link import cluster_exports
from support import netns

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def pair() -> Iterator[netns.NodePair]:
    with netns.node_pair_or_skip() as made:
        yield made


def test_one_node_needs_no_link() -> None:
    one = {"CLUSTER_NODES": "1", "CLUSTER_IFACE": "nonesuch", "CLUSTER_HEAD_ADDR": ""}
    assert cluster_exports(one) == {"CLUSTER_HOST_IP": ""}


@dataclass(frozen=True)
class Started:
    """What the start step did: its status, and its one line when it refused."""

    done: subprocess.CompletedProcess[str]
    refusal: str


def _resolve_in(pair: netns.NodePair, namespace: str, **knobs: str) -> Started:
    env = {
        "PATH": os.environ["PATH"], "PYTHONPATH": str(SRC), "GPU_MEM": "0.3",
        "OS_RESERVE_GB": "4", "CLUSTER_NODES": "2", "DRY_RUN": "1",
        "HOST": "127.0.0.1",  # a host run: beyond loopback it would need API_KEY
        **knobs,
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as work:  # the namespaces share this filesystem
        records = Path(work) / "records"
        argv = ["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "sparkserve",
                "start", "--launcher", "dflash", "--prog", "serve.sh", "--pid", "1",
                "--records", str(records)]  # fmt: skip
        done = pair.run(namespace, *argv, check=False)
        refusal = records.read_text() if done.returncode != 0 and records.exists() else ""
    return Started(done, refusal)


@dataclass(frozen=True)
class DryRun:
    env: dict[str, str]  # vLLM's environment
    watch: list[str]  # the pair watch's command
    argv: list[str]  # vLLM's arguments


def _dry_run(started: Started) -> DryRun:
    """The start the step printed (DRY_RUN=1)."""
    assert started.done.returncode == 0, started.done.stderr + started.refusal
    env, watch, argv = {}, [], []
    for line in started.done.stdout.splitlines():
        kind, _, rest = line.partition(": ")
        if kind == "env":
            name, _, value = rest.partition("=")
            env[name] = shlex.split(value)[0] if value else ""
        elif kind == "watch":
            watch = shlex.split(rest)
        elif kind == "exec":
            argv = shlex.split(rest)[2:]
    return DryRun(env, watch, argv)


def _host_ip(run: DryRun) -> str:
    return run.watch[run.watch.index("--host-ip") + 1]


def _head(pair: netns.NodePair, **knobs: str) -> Started:
    return _resolve_in(pair, pair.head, **{"CLUSTER_RANK": "0",
                       "CLUSTER_HEAD_ADDR": pair.head_ip, "CLUSTER_IFACE": pair.head_if,
                       **knobs})  # fmt: skip


def test_the_head_and_the_worker_find_their_address_on_the_link(pair: netns.NodePair) -> None:
    head = _dry_run(_head(pair, CLUSTER_JOIN_TIMEOUT_S="600.5"))
    assert _host_ip(head) == pair.head_ip
    argv = head.argv
    assert argv[argv.index("--distributed-timeout-seconds") + 1] == "601"
    assert head.env["VLLM_HOST_IP"] == pair.head_ip
    worker = _dry_run(
        _resolve_in(
            pair,
            pair.worker,
            CLUSTER_RANK="1",
            CLUSTER_HEAD_ADDR=pair.head_ip,
            CLUSTER_IFACE=pair.worker_if,
        )
    )
    assert _host_ip(worker) == pair.worker_ip


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
    assert (refused.done.returncode, refused.done.stdout) == (2, ""), refused.done.stderr
    assert "\n" not in refused.refusal and message in refused.refusal, refused.refusal


def test_a_down_interface_and_one_without_an_address_are_refused() -> None:
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    with netns.node_pair() as pair:
        ok = _dry_run(
            _resolve_in(
                pair,
                pair.worker,
                CLUSTER_RANK="1",
                CLUSTER_HEAD_ADDR=pair.head_ip,
                CLUSTER_IFACE=pair.worker_if,
            )
        )
        assert _host_ip(ok) == pair.worker_ip
        pair.cut(pair.head)
        down = _resolve_in(pair, pair.head, CLUSTER_HEAD_ADDR=pair.head_ip,
                           CLUSTER_IFACE=pair.head_if)  # fmt: skip
        assert (down.done.returncode, down.done.stdout) == (2, "")
        assert down.refusal == (
            f"serve.sh: CLUSTER_IFACE='{pair.head_if}': the interface is down (bring it up: "
            f"ip link set {pair.head_if} up)"
        )
        pair.wait_carrier(pair.worker, pair.worker_if, up=False)
        cable = _resolve_in(pair, pair.worker, CLUSTER_RANK="1", CLUSTER_HEAD_ADDR=pair.head_ip,
                            CLUSTER_IFACE=pair.worker_if)  # fmt: skip
        assert cable.refusal == (
            f"serve.sh: CLUSTER_IFACE='{pair.worker_if}': the interface is up but has no link "
            "(no carrier: check the cable and the other machine's port)"
        )
        pair.run(pair.head, "ip", "link", "set", pair.head_if, "up")
        pair.wait_carrier(pair.worker, pair.worker_if)
        pair.run(pair.worker, "ip", "addr", "flush", "dev", pair.worker_if)
        bare = _resolve_in(pair, pair.worker, CLUSTER_RANK="1", CLUSTER_HEAD_ADDR=pair.head_ip,
                           CLUSTER_IFACE=pair.worker_if)  # fmt: skip
        assert bare.done.returncode == 2
        assert bare.refusal.startswith(
            f"serve.sh: CLUSTER_IFACE='{pair.worker_if}' has no IPv4 address: give it one"
        )
        assert "\n" not in bare.refusal
