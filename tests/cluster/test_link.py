"""The pair's link knobs, checked against this machine's real interfaces.

The loopback interface serves where no root is needed (the head owns 127.0.0.1, a worker's
head is 127.0.0.2 in the same /8); a down interface and one without an address are made in a
network namespace (root only)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkserve.cluster.link import cluster_exports
from sparkserve.knobs import KnobError
from support import netns

SRC = Path(__file__).resolve().parents[2] / "src"
PAIR = {
    "CLUSTER_NODES": "2", "CLUSTER_RANK": "0", "CLUSTER_HEAD_ADDR": "127.0.0.1",
    "CLUSTER_IFACE": "lo", "CLUSTER_PORT": "29501", "CLUSTER_WATCH_PORT": "29510",
    "PORT": "8000", "CLUSTER_JOIN_TIMEOUT_S": "600.5",
}  # fmt: skip


def test_one_node_needs_no_link() -> None:
    assert cluster_exports({**PAIR, "CLUSTER_NODES": "1", "CLUSTER_IFACE": "nonesuch"}) == {
        "CLUSTER_HOST_IP": "", "CLUSTER_DIST_TIMEOUT_S": ""
    }  # fmt: skip


def test_the_head_and_the_worker_find_their_address_on_the_link() -> None:
    assert cluster_exports(PAIR) == {
        "CLUSTER_HOST_IP": "127.0.0.1", "CLUSTER_DIST_TIMEOUT_S": "601"
    }  # fmt: skip
    worker = {**PAIR, "CLUSTER_RANK": "1", "CLUSTER_HEAD_ADDR": "127.0.0.2"}
    assert cluster_exports(worker)["CLUSTER_HOST_IP"] == "127.0.0.1"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"CLUSTER_HEAD_ADDR": ""}, "CLUSTER_HEAD_ADDR='': required with CLUSTER_NODES=2"),
        ({"CLUSTER_IFACE": ""}, "CLUSTER_IFACE='': required with CLUSTER_NODES=2"),
        ({"CLUSTER_HEAD_ADDR": "300.1.2.3"}, "CLUSTER_HEAD_ADDR='300.1.2.3': not an IPv4"),
        ({"CLUSTER_IFACE": "eth9x"}, r"CLUSTER_IFACE='eth9x': no such interface here \(have: .*lo"),
        ({"CLUSTER_HEAD_ADDR": "10.9.0.1"},
         r"CLUSTER_HEAD_ADDR='10.9.0.1': not in the network of CLUSTER_IFACE='lo' \(have: 127"),
        ({"CLUSTER_HEAD_ADDR": "127.0.0.2"},
         r"on the head \(CLUSTER_RANK=0\) it must be this machine's own address"),
        ({"CLUSTER_RANK": "1"}, r"on the worker \(CLUSTER_RANK=1\) it must be the head's"),
        ({"CLUSTER_WATCH_PORT": "29501"},
         "CLUSTER_WATCH_PORT='29501': the same port as CLUSTER_PORT"),
        ({"PORT": "29510"}, "PORT='29510': the same port as CLUSTER_WATCH_PORT"),
    ],
)  # fmt: skip
def test_each_bad_link_knob_is_one_line(change: dict[str, str], message: str) -> None:
    with pytest.raises(KnobError, match=message) as raised:
        cluster_exports({**PAIR, **change})
    assert "\n" not in str(raised.value)


def _resolve_in(
    pair: netns.NodePair, namespace: str, **knobs: str
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"], "PYTHONPATH": str(SRC), "GPU_MEM": "0.3",
        "OS_RESERVE_GB": "4", "CLUSTER_NODES": "2", **knobs,
    }  # fmt: skip
    argv = ["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "sparkserve",
            "knobs", "resolve", "--launcher", "dflash", "--prog", "serve.sh"]  # fmt: skip
    return pair.run(namespace, *argv, check=False)


def test_a_down_interface_and_one_without_an_address_are_refused_fast() -> None:
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    with netns.node_pair() as pair:
        ok = _resolve_in(pair, pair.worker, CLUSTER_RANK="1", CLUSTER_HEAD_ADDR=pair.head_ip,
                         CLUSTER_IFACE=pair.worker_if)  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        assert f"export CLUSTER_HOST_IP='{pair.worker_ip}'" in ok.stdout
        pair.cut(pair.head)
        started = time.monotonic()
        down = _resolve_in(pair, pair.head, CLUSTER_HEAD_ADDR=pair.head_ip,
                           CLUSTER_IFACE=pair.head_if)  # fmt: skip
        assert time.monotonic() - started < 5
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
            f"serve.sh: CLUSTER_IFACE='{pair.worker_if}': the interface has no IPv4 address"
        )
        assert bare.stderr.count("\n") == 1
