"""The pair watch with real processes and real sockets on the loopback interface.

Each node's "vLLM" is a small process tree (a shell with a child), so that stopping it shows
whether the whole tree goes; one of them ignores SIGTERM, as a rank stuck in a collective
does. The two-namespace test (tests/e2e/test_cluster_pair.py) runs the same watch in front of
the real engine."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from sparkserve.cluster import health, wire
from sparkserve.cluster.watch import EXIT_STOPPED
from sparkserve.command_line import EXIT_BAD_INPUT
from support import netns
from support.promises import pair_stop_bound_s
from support.vllm_server import LOOPBACK, free_port
from support.watches import wait_joined as joined
from support.watches import watch_argv

PEER_TIMEOUT_S = 2.0  # CLUSTER_PEER_TIMEOUT_S's minimum (knobs/registry.py): silence is found fast
# The default, for the pair whose health is checked: `cluster health` reads a state file
# written once a beat, so a beat it reports can be two beats old (too close to 2 s).
DEFAULT_PEER_TIMEOUT_S = 5.0
# The watch's own default --grace-s, the grace the promise is stated with (a shorter one
# leaves a busy machine's scheduling too little of the bound).
GRACE_S = 5.0
# The promised bound from a failure to the surviving node's tree gone (docs/CLUSTER.md, "The
# bound": CLUSTER_PEER_TIMEOUT_S + 7 s with the 5 s grace), asserted on the measured time; the
# figures: benchmarks/watch_reaction.py.
BOUND_S = pair_stop_bound_s(PEER_TIMEOUT_S, GRACE_S)
# Every wait: a guard against a hang, not a speed target (a slow machine fails on a measured
# time with the watch's stamped log, never on a wait that ran out).
HANG_S = 120.0
# A tree that ignores SIGTERM.
STUBBORN = "trap '' TERM; sleep 300 & wait"  # the child inherits the ignored SIGTERM
POLITE = "trap 'kill $!; exit 0' TERM; sleep 300 & wait"  # stops its child, as vLLM does


@dataclass
class Node:
    served: subprocess.Popen[bytes]  # this node's stand-in for vLLM
    watch: subprocess.Popen[str]
    state_file: Path
    # (time.monotonic() on arrival, line) of the watch's stderr, read as it comes
    lines: list[tuple[float, str]] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)
    reader: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.watch.stderr is not None
        for line in self.watch.stderr:
            self.lines.append((time.monotonic(), line))

    def tree(self) -> list[psutil.Process]:
        try:
            top = psutil.Process(self.served.pid)
            return [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def log(self) -> str:
        """The whole log, once the watch has exited."""
        assert self.reader is not None
        self.reader.join(timeout=HANG_S)
        assert not self.reader.is_alive(), "the watch's stderr stayed open after it exited"
        return "".join(line for _, line in self.lines)

    def seen_at(self, text: str) -> float | None:
        """time.monotonic() when the first log line with `text` arrived."""
        return next((at for at, line in self.lines if text in line), None)

    def timeline(self, since: float) -> str:
        """The log, each line stamped with the seconds since `since` (a failure message)."""
        return "".join(f"{at - since:+7.2f} s  {line}" for at, line in self.lines)


def start_node(
    tmp: Path, rank: int, port: int, served: str = POLITE, join_s: float = HANG_S,
    env: dict[str, str] | None = None, peer_timeout_s: float = PEER_TIMEOUT_S,
) -> Node:  # fmt: skip
    tree = subprocess.Popen(["sh", "-c", served], start_new_session=True)
    state_file = tmp / f"state-{rank}.json"
    argv = watch_argv(
        tree.pid, rank, LOOPBACK, LOOPBACK, port, state_file,
        peer_timeout_s=peer_timeout_s, join_timeout_s=join_s, grace_s=GRACE_S,
    )  # fmt: skip
    watch = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    return Node(tree, watch, state_file)


def wait_joined(node: Node) -> None:
    joined(node.state_file, [node.watch], HANG_S)


def running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def finish(node: Node) -> tuple[int, str]:
    """The watch's exit status and log, once it and (when it stopped it) its tree are gone."""
    try:
        code = node.watch.wait(timeout=HANG_S)
        if code == EXIT_STOPPED:  # it stopped its node's tree
            node.served.wait(timeout=HANG_S)
    except subprocess.TimeoutExpired as hung:
        raise AssertionError(f"hung: {hung}; its log:\n{node.timeline(node.started_at)}") from None
    return code, node.log()


def stopped_within_bound(
    node: Node, tree: list[psutil.Process], failed_at: float, bound_s: float = BOUND_S
) -> str:
    """Waits for `node`'s watch to stop its tree, then asserts the promised bound on the time
    from the failure (`failed_at`, time.monotonic()) to the tree gone; returns the log."""
    code, log = finish(node)
    # The tree's end as the watch measured it: its stop line comes once the tree is gone.
    gone_at = node.seen_at(f"vLLM (pid {node.served.pid}) ")
    assert code == EXIT_STOPPED and gone_at is not None, (code, log)
    assert not any(running(proc) for proc in tree)
    took = gone_at - failed_at
    assert took <= bound_s, (
        f"the tree was gone {took:.1f} s after the failure, past the promised {bound_s:g} s "
        f"(docs/CLUSTER.md, The bound); the watch's log, from the failure:\n"
        f"{node.timeline(failed_at)}"
    )
    return log


@pytest.fixture()
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    started: list[Node] = []
    yield started
    for node in started:
        leftovers = node.tree() if node.served.poll() is None else []  # before any reaping
        for proc in (node.watch, node.served):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for leftover in leftovers:
            with contextlib.suppress(psutil.NoSuchProcess):
                leftover.kill()


def pair(
    tmp: Path, nodes: list[Node], head_served: str = POLITE, peer_timeout_s: float = PEER_TIMEOUT_S
) -> tuple[Node, Node, int]:
    port = free_port()
    head = start_node(tmp, 0, port, head_served, peer_timeout_s=peer_timeout_s)
    worker = start_node(tmp, 1, port, peer_timeout_s=peer_timeout_s)
    nodes += [head, worker]
    wait_joined(head)
    wait_joined(worker)
    return head, worker, port


def test_a_joined_pair_answers_probes_and_a_dead_vllm_stops_both(
    tmp_path: Path, nodes: list[Node]
) -> None:
    head, worker, port = pair(
        tmp_path, nodes, head_served=STUBBORN, peer_timeout_s=DEFAULT_PEER_TIMEOUT_S
    )
    about = wire.request(LOOPBACK, port, {"kind": "probe"}, HANG_S)
    deadline = time.monotonic() + HANG_S
    while set(about["memory"]) != {"0", "1"} and time.monotonic() < deadline:  # a worker's beat
        time.sleep(0.1)
        about = wire.request(LOOPBACK, port, {"kind": "probe"}, HANG_S)
    assert about["kind"] == "about" and about["rank"] == 0
    assert set(about["memory"]) == {"0", "1"}, f"no beat from the worker in {HANG_S:g} s"
    assert {"available_gib", "total_gib", "swap_used_gib", "at"} <= set(about["memory"]["1"])
    assert health.problem(head.state_file) is None
    assert check_health(worker.state_file) == (0, "")
    head_tree = head.tree()
    assert len(head_tree) == 2

    os.killpg(worker.served.pid, signal.SIGKILL)  # the worker's vLLM dies
    bound_s = pair_stop_bound_s(DEFAULT_PEER_TIMEOUT_S, GRACE_S)
    log = stopped_within_bound(head, head_tree, time.monotonic(), bound_s)
    assert f"node 1 ({LOOPBACK}): vLLM exited; stopping this node's vLLM" in log
    # no drain: the child at once; the top ignores SIGTERM, but its wait for the child ends
    assert re.search(
        r"SIGKILL to 1 process\(es\) \(\S+ \d+\) below the top at once \(no drain\); the top "
        "exited",
        log,
    ), log
    assert finish(worker)[0] == EXIT_STOPPED
    code, said = check_health(head.state_file)
    assert code == 1 and said.startswith("sparkserve cluster health: the pair watch is not running")
    assert said.count("\n") == 1


def check_health(state_file: Path) -> tuple[int, str]:
    """`sparkserve cluster health`, as compose's healthcheck runs it."""
    argv = [
        sys.executable,
        "-m",
        "sparkserve",
        "cluster",
        "health",
        "--state-file",
        str(state_file),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_S)
    return done.returncode, done.stdout + done.stderr


def test_health_without_a_watch_is_one_line(tmp_path: Path) -> None:
    code, said = check_health(tmp_path / "none.json")
    assert code == 1
    assert said == (
        f"sparkserve cluster health: no pair watch state in {tmp_path / 'none.json'} "
        "(CLUSTER_NODES=2 and the launcher started?)\n"
    )


def test_a_silent_peer_counts_as_lost(tmp_path: Path, nodes: list[Node]) -> None:
    head, worker, _ = pair(tmp_path, nodes)
    head_tree = head.tree()
    worker.watch.send_signal(signal.SIGSTOP)  # alive, connected, silent: a cut link
    silent_from = time.monotonic()
    log = stopped_within_bound(head, head_tree, silent_from)
    assert f"node 1 ({LOOPBACK}): no heartbeat for" in log
    assert "link down or host gone" in log
    assert "exited after SIGTERM" in log
    worker.watch.send_signal(signal.SIGCONT)  # it finds the head gone and stops its side
    assert finish(worker)[0] == EXIT_STOPPED


def test_a_host_too_busy_to_run_both_watches_is_not_a_lost_peer(
    tmp_path: Path, nodes: list[Node]
) -> None:
    """Both watches stopped together for longer than the peer timeout (one host that
    schedules neither), the head resumed a moment before the worker: on resuming, neither
    blames the other, and the pair stays joined."""
    head, worker, _ = pair(tmp_path, nodes)
    for node in (head, worker):
        node.watch.send_signal(signal.SIGSTOP)
    time.sleep(1.5 * PEER_TIMEOUT_S)
    head.watch.send_signal(signal.SIGCONT)
    time.sleep(PEER_TIMEOUT_S / 4)
    worker.watch.send_signal(signal.SIGCONT)
    time.sleep(PEER_TIMEOUT_S)  # a whole timeout after resuming, with beats flowing
    assert head.watch.poll() is None and worker.watch.poll() is None
    for node in (head, worker):
        assert json.loads(node.state_file.read_text())["state"] == "joined"
        node.watch.send_signal(signal.SIGTERM)
    assert "no heartbeat" not in finish(head)[1] + finish(worker)[1]


@pytest.mark.parametrize("burst", [False, True], ids=["one-sigterm", "a-burst-of-sigterms"])
def test_a_stopped_head_watch_says_bye_and_the_worker_stops(
    tmp_path: Path, nodes: list[Node], burst: bool
) -> None:
    """SIGTERMs arrive more than once when a node stops (compose's, then the kernel's when vLLM
    exits): each must only be noted, never wedge the watch (a handler that takes a lock
    deadlocks when the next SIGTERM lands while it holds it). The burst goes on through a stop
    that takes a while (a tree that ignores SIGTERM), until the watch exits."""
    head, worker, _ = pair(tmp_path, nodes, head_served=STUBBORN if burst else POLITE)
    head.watch.send_signal(signal.SIGTERM)
    burst_until = time.monotonic() + (3.0 if burst else 0.0)
    while head.watch.poll() is None and time.monotonic() < burst_until:
        head.watch.send_signal(signal.SIGTERM)
    code, log = finish(worker)
    assert code == EXIT_STOPPED
    assert f"node 0 ({LOOPBACK}): its watch got SIGTERM (the node is stopping)" in log
    code, log = finish(head)
    # A SIGTERM that lands once Python has put the default handler back at exit ends the
    # process by the signal instead of with its status: after the stop, so harmless.
    assert code in (EXIT_STOPPED, -signal.SIGTERM)
    assert "its watch got SIGTERM (the node is stopping); stopping this node's vLLM" in log
    assert f"vLLM (pid {head.served.pid}) " in log  # the stop finished and said how


def test_different_software_is_refused_and_the_head_waits_for_a_worker_that_matches(
    tmp_path: Path, nodes: list[Node]
) -> None:
    """The worker stops with the refusal; the head logs it and goes on waiting, so a join it
    refuses (another node's, or a forged one) never ends its wait: the right worker still
    joins."""
    port = free_port()
    head = start_node(tmp_path, 0, port)
    other = dict(os.environ, SPARKSERVE_IMAGE="cpu")
    worker = start_node(tmp_path, 1, port, env=other)
    nodes += [head, worker]
    worker_code, worker_log = finish(worker)
    assert worker_code == EXIT_BAD_INPUT
    assert "refused this node: its software differs (here = head): image: here host, peer cpu" in (
        worker_log
    )
    refused = f"node 1 ({LOOPBACK}) refused: its software differs (here = head): image: here "
    deadline = time.monotonic() + HANG_S
    while head.seen_at(refused) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert head.seen_at(refused) is not None, head.timeline(head.started_at)
    assert head.watch.poll() is None, "the head stopped on a refused join"
    assert json.loads(head.state_file.read_text())["state"] == "waiting"
    (tmp_path / "matching").mkdir()
    matching = start_node(tmp_path / "matching", 1, port)  # a state file of its own
    nodes.append(matching)
    wait_joined(head)
    wait_joined(matching)


def test_a_worker_waits_for_a_head_that_is_not_listening_until_the_join_timeout(
    tmp_path: Path, nodes: list[Node]
) -> None:
    join_s = 3.0
    worker = start_node(tmp_path, 1, free_port(), join_s=join_s)
    nodes.append(worker)
    started = time.monotonic()
    code, log = finish(worker)
    assert code == EXIT_BAD_INPUT
    # The promise (docs/CLUSTER.md): it keeps trying for the whole CLUSTER_JOIN_TIMEOUT_S.
    assert time.monotonic() - started >= join_s
    assert "connection refused: its watch is not listening yet" in log
    assert "no pair after 3 s (CLUSTER_JOIN_TIMEOUT_S)" in log
    assert worker.served.poll() is None  # nothing joined, nothing stopped: the launcher exits


SECRET = "pair-secret-0123456789abcdef"
# Run in the worker's namespace: what a stranger on the link sends the head's watch port, each
# answer printed as a JSON line. argv: head address, port, the secret it guesses, a message
# recorded off the link (signed with the real secret) to send twice.
STRANGER = """
import json, socket, sys
from sparkserve.cluster import wire
host, port, guess, recorded = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4]

def raw(message):
    with socket.create_connection((host, port), timeout=30) as sock:
        wire.send(sock, message)
        return wire.LineReader(sock).receive(30)

forged = {"rank": 1, "identity": {"image": "forged"}}
for answer in (
    raw({"kind": "probe"}),
    wire.request(host, port, {"kind": "probe"}, 30, secret=guess),
    raw({"kind": "join", **forged}),
    wire.request(host, port, {"kind": "join", **forged}, 30, secret=guess),
    raw(json.loads(recorded)),
    raw(json.loads(recorded)),
):
    print(json.dumps(answer), flush=True)
"""


def test_a_join_or_probe_without_the_secret_is_refused_and_logged_and_the_head_goes_on(
    tmp_path: Path, nodes: list[Node]
) -> None:
    """Across two network namespaces (the link): a stranger in the worker's namespace probes
    and joins the head's watch with no proof, with a guessed secret, and replays a message
    recorded off the link. Each is refused and logged; the head goes on waiting, and the
    worker that holds CLUSTER_SECRET then joins it and its probe is answered."""
    with netns.node_pair_or_skip() as net:
        port = free_port()
        env = {**os.environ, "CLUSTER_SECRET": SECRET}
        head = start_in(net, 0, tmp_path, port, env)
        nodes.append(head)
        deadline = time.monotonic() + HANG_S
        while head.seen_at("waiting for the worker") is None and time.monotonic() < deadline:
            time.sleep(0.1)
        recorded = json.dumps(wire.sign({"kind": "probe"}, SECRET.encode()))
        argv = [sys.executable, "-c", STRANGER, net.head_ip, str(port), "not-" + SECRET, recorded]
        done = subprocess.run(
            net.argv(1, argv), capture_output=True, text=True, timeout=HANG_S,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        answers = [json.loads(line) for line in done.stdout.splitlines()]
        kinds = [answer["kind"] for answer in answers]
        assert kinds == ["refused"] * 4 + ["about", "refused"], answers
        assert [a["reason"] for a in answers[:4]] == [wire.NO_PROOF] * 4
        assert "used before" in answers[5]["reason"]
        assert head.watch.poll() is None, "the head stopped on a stranger's message"
        assert json.loads(head.state_file.read_text())["state"] == "waiting"
        log = head.timeline(head.started_at)
        for kind in ("probe", "join"):
            said = f"refused a {kind} from {net.worker_ip}: {wire.NO_PROOF}"
            assert log.count(said) == 2, log
        assert f"refused a probe from {net.worker_ip}: its proof was used before" in log

        worker = start_in(net, 1, tmp_path, port, env)
        nodes.append(worker)
        wait_joined(head)
        wait_joined(worker)
        probe = [sys.executable, "-c", PROBE, net.head_ip, str(port)]
        asked = subprocess.run(
            net.argv(1, probe), capture_output=True, text=True, timeout=HANG_S, env=env
        )
        assert json.loads(asked.stdout)["kind"] == "about", asked.stdout + asked.stderr
        head.watch.send_signal(signal.SIGTERM)
        assert finish(worker)[0] == EXIT_STOPPED


# A probe as `sparkserve doctor` and stress_mem.sh send it: signed with CLUSTER_SECRET from
# the environment.
PROBE = """
import json, sys
from sparkserve.cluster import wire
print(json.dumps(wire.request(sys.argv[1], int(sys.argv[2]), {"kind": "probe"}, 30)))
"""


def start_in(net: netns.NodePair, rank: int, tmp: Path, port: int, env: dict[str, str]) -> Node:
    """A node whose watch runs in its side's namespace, on the link's addresses."""
    tree = subprocess.Popen(["sh", "-c", POLITE], start_new_session=True)
    state_file = tmp / f"state-{rank}.json"
    argv = watch_argv(
        tree.pid, rank, net.head_ip, net.addresses[rank], port, state_file,
        peer_timeout_s=DEFAULT_PEER_TIMEOUT_S, join_timeout_s=HANG_S, grace_s=GRACE_S,
    )  # fmt: skip
    env = {**env, "PYTHONPATH": os.pathsep.join(sys.path)}
    watch = subprocess.Popen(net.argv(rank, argv), stderr=subprocess.PIPE, text=True, env=env)
    return Node(tree, watch, state_file)
