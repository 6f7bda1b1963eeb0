"""The pair's pre-flight: the head's and the worker's `sparkserve doctor` meet over the link.

Run on both nodes at about the same time. The head's doctor listens on CLUSTER_HEAD_ADDR at
CLUSTER_PORT and CLUSTER_WATCH_PORT (the two fixed ports of a running pair) and on one
ephemeral port; the worker's doctor connects to both fixed ports and sends a wire probe
carrying its identity, its end of the link and an ephemeral port of its own. The head connects
back to that port, answers with its identity, its end of the link and its ephemeral port, and
the worker connects there. So every path the engine needs is proven through whatever firewall
sits in between, both ways, and each side compares the other's identity and MTU with its own.

When the head's ports are taken, its server is probably running: the doctor then probes the
running watch instead (`wire` probe), and so does a worker's doctor that finds a running head.

The ports vLLM's native multi-node engine uses between the nodes (vLLM 0.33.0, by function):
- CLUSTER_PORT on the head: torch.distributed's rendezvous (TCPStore) at --master-addr and
  --master-port (`init_distributed_environment`, distributed/parallel_state.py; default 29501,
  `ParallelConfig.master_port`, config/parallel.py);
- ephemeral ports on both nodes: the cross-node message queues bind `tcp://<VLLM_HOST_IP>:0`
  (`MessageQueue.__init__`, distributed/device_communicators/shm_broadcast.py): the head's
  scheduler queue (`MultiprocExecutor._init_executor`) and each worker's reply queue
  (`WorkerProc._init_message_queues`, both v1/executor/multiproc_executor.py);
  gloo's TCP pairs and NCCL's bootstrap also listen on ephemeral ports of the named interface;
- CLUSTER_WATCH_PORT on the head: sparkserve's own pair watch.
"""

from __future__ import annotations

import contextlib
import errno
import select
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkserve.cluster import wire
from sparkserve.cluster.check_row import Check
from sparkserve.cluster.identity import differences

PORTS_NEEDED = (
    "open between the nodes: TCP CLUSTER_PORT and CLUSTER_WATCH_PORT to the head, and any "
    "ephemeral TCP port both ways (vLLM's cross-node message queues bind port 0, "
    "MessageQueue in shm_broadcast.py; gloo and NCCL too): trust the link's interface"
)
CONNECT_S = 2.0  # one connection attempt
REPLY_S = 10.0  # a probe's answer (the head first connects back, CONNECT_S at most)
RETRY_S = 0.5


@dataclass
class Side:
    """One node's view before the meeting."""

    rank: int
    head: str  # CLUSTER_HEAD_ADDR
    port: int  # CLUSTER_PORT
    watch_port: int  # CLUSTER_WATCH_PORT
    local: str  # this node's address on the link
    identity: dict[str, str]
    link: dict[str, int]  # {"mtu", "speed_mbps"}
    wait_s: float
    secret: bytes = b""  # CLUSTER_SECRET: a running pair watch answers probes that prove it


@dataclass
class Meeting:
    """What the head's doctor saw while it waited."""

    store_peers: list[str] = field(default_factory=list)  # who connected to CLUSTER_PORT
    probe: dict[str, Any] | None = None  # the worker doctor's probe
    back: str = ""  # the head reaching the worker's ephemeral port: "" ok, else why not
    spare_reached: bool = False
    notes: list[str] = field(default_factory=list)


def why_not(error: OSError) -> str:
    """A connection failure in words, with its likely cause."""
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    if isinstance(error, TimeoutError):
        return "no answer (a firewall dropping packets, or a wrong address)"
    if error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"{error.strerror} (no route over the link)"
    return error.strerror or str(error)


def reach(host: str, port: int, timeout: float = CONNECT_S) -> str:
    """Connect and close: "" when it worked, else why not."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        return why_not(error)
    return ""


def listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(8)
    except OSError:
        sock.close()
        raise
    return sock


def identity_row(mine: Mapping[str, str], peer: Mapping[str, str], whose: str) -> Check:
    found = differences(mine, peer)
    if found:
        return Check("pair identity", "blocker", f"{whose} runs other code: " + "; ".join(found))
    note = "" if mine.get("image") != "host" else " (run the doctor in the image to compare images)"
    return Check(
        "pair identity",
        "ok",
        f"same image {mine.get('image')}, vLLM {mine.get('vllm')}, torch {mine.get('torch')}, "
        f"sparkserve {mine.get('sparkserve')}{note}",
    )


def link_row(mine: Mapping[str, int], peer: Mapping[str, Any]) -> Check:
    detail = (
        f"MTU here {mine.get('mtu')}, peer {peer.get('mtu')}; speed here "
        f"{mine.get('speed_mbps')}, peer {peer.get('speed_mbps')} Mb/s"
    )
    if mine.get("mtu") != peer.get("mtu"):
        return Check("pair link", "warn", f"{detail}: set the same MTU on both ends")
    return Check("pair link", "ok", detail)


# The head


def head_rows(side: Side) -> list[Check]:
    opened: list[socket.socket] = []
    try:
        for port in (side.port, side.watch_port, 0):
            opened.append(listen(side.head, port))
    except OSError as error:
        for sock in opened:
            sock.close()
        taken = (side.port, side.watch_port, 0)[len(opened)]
        if error.errno == errno.EADDRINUSE:
            return running_head_rows(side, taken)
        return [
            Check(
                "pair server", "blocker", f"cannot listen on {side.head}:{taken}: {why_not(error)}"
            )
        ]
    store, watch, spare = opened
    spare_port = spare.getsockname()[1]
    try:
        meeting = meet_worker(side, store, watch, spare)
    finally:
        for sock in opened:
            sock.close()
    return head_report(side, meeting, spare_port)


def meet_worker(
    side: Side, store: socket.socket, watch: socket.socket, spare: socket.socket
) -> Meeting:
    """Wait up to side.wait_s for a worker doctor's probe; answer plain probes meanwhile."""
    meeting = Meeting()
    deadline = time.monotonic() + side.wait_s
    while meeting.probe is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return meeting
        ready, _, _ = select.select([store, watch], [], [], left)
        if store in ready:
            connection, (peer, _) = store.accept()
            connection.close()
            meeting.store_peers.append(peer)
        if watch in ready:
            connection, _ = watch.accept()
            with connection:
                answer(side, connection, meeting, spare.getsockname()[1])
    spare.settimeout(CONNECT_S * 2)
    with contextlib.suppress(OSError):
        spare.accept()[0].close()
        meeting.spare_reached = True
    return meeting


def answer(side: Side, connection: socket.socket, meeting: Meeting, spare_port: int) -> None:
    try:
        message = wire.LineReader(connection).receive(CONNECT_S * 2)
    except OSError as error:
        meeting.notes.append(f"a connection to the watch port sent no probe: {error}")
        return
    if message["kind"] == "join":
        meeting.notes.append("the worker's server tried to join: stop it, or start the head's")
        reason = "sparkserve doctor listens here, not the head's server"
        with contextlib.suppress(OSError):
            wire.send(connection, {"kind": "refused", "reason": reason})
        return
    if message["kind"] != "probe":
        return
    about: dict[str, Any] = {
        "kind": "about", "rank": 0, "identity": side.identity, "memory": {"0": wire.reading()},
    }  # fmt: skip
    doctor = message.get("doctor")
    if isinstance(doctor, dict):
        meeting.probe = message
        meeting.back = reach(str(doctor.get("addr")), int(doctor.get("port", 0)))
        about["doctor"] = {"port": spare_port, "back": meeting.back, "link": side.link}
    with contextlib.suppress(OSError):
        wire.send(connection, about)


def head_report(side: Side, meeting: Meeting, spare_port: int) -> list[Check]:
    fixed = f"{side.head}:{side.port} and :{side.watch_port}"
    if meeting.probe is None:
        peers = ", ".join(sorted(set(meeting.store_peers)))
        seen = f"; {peers} reached :{side.port} but sent no probe" if peers else ""
        notes = "".join(f"; {note}" for note in meeting.notes)
        return [
            Check(
                "peer",
                "blocker",
                f"no worker doctor reached {fixed} within {side.wait_s:g} s{seen}{notes}: run "
                "`sparkserve doctor` on the worker (CLUSTER_RANK=1) at the same time; "
                + PORTS_NEEDED,
            )
        ]
    doctor = meeting.probe["doctor"]
    worker = str(doctor.get("addr"))
    problems = []
    if worker not in meeting.store_peers:
        problems.append(f"the worker did not connect to :{side.port}")
    if meeting.back:
        problems.append(
            f"this node could not reach the worker's port {doctor.get('port')}: {meeting.back}"
        )
    if not meeting.spare_reached:
        problems.append(f"the worker did not reach this node's port {spare_port}")
    if problems:
        peer = Check(
            "peer", "blocker", f"worker {worker}: " + "; ".join(problems) + "; " + PORTS_NEEDED
        )
    else:
        peer = Check(
            "peer",
            "ok",
            f"worker {worker} reached {fixed} and ephemeral port {spare_port} here; this node "
            f"reached its ephemeral port {doctor.get('port')}",
        )
    return [
        peer,
        identity_row(side.identity, meeting.probe.get("identity") or {}, "the worker"),
        link_row(side.link, doctor.get("link") or {}),
    ]


def running_head_rows(side: Side, taken: int) -> list[Check]:
    """The head's ports are taken: is it this pair's server (its watch answers a probe)?"""
    try:
        about = wire.request(
            side.head,
            side.watch_port,
            {"kind": "probe", "identity": side.identity},
            REPLY_S,
            side.secret,
        )
    except OSError as error:
        return [
            Check(
                "pair server",
                "blocker",
                f"{side.head}:{taken} is taken and no pair watch answers on :{side.watch_port} "
                f"({why_not(error)}): another program holds a port the pair needs",
            )
        ]
    joined = "1" in (about.get("memory") or {})
    state = "the worker has joined" if joined else "no worker has joined yet"
    rows = [
        Check(
            "pair server",
            "ok" if joined else "info",
            f"{side.head}:{taken} is taken: the pair's server runs here (its watch "
            f"answered; {state})",
        )
    ]
    found = differences(side.identity, about.get("identity") or {})
    if found:
        rows.append(
            Check(
                "pair identity",
                "warn",
                "the running server runs other code than this doctor: " + "; ".join(found),
            )
        )
    return rows


# The worker


def worker_rows(side: Side) -> list[Check]:
    try:
        back = listen(side.local, 0)
    except OSError as error:
        return [Check("peer", "blocker", f"cannot listen on {side.local}: {why_not(error)}")]
    reached = threading.Event()

    def accept_back() -> None:
        with contextlib.suppress(OSError):
            back.accept()[0].close()
            reached.set()

    back.settimeout(side.wait_s + REPLY_S)
    waiter = threading.Thread(target=accept_back, daemon=True)
    waiter.start()
    try:
        return meet_head(side, back.getsockname()[1], reached)
    finally:
        with contextlib.suppress(OSError):
            back.shutdown(socket.SHUT_RDWR)  # wakes the accept above
        back.close()
        waiter.join(timeout=1)


def meet_head(side: Side, back_port: int, reached: threading.Event) -> list[Check]:
    deadline = time.monotonic() + side.wait_s
    probe = {
        "kind": "probe", "rank": 1, "identity": side.identity,
        "doctor": {"addr": side.local, "port": back_port, "link": side.link},
    }  # fmt: skip
    where = f"{side.head}:{side.port}"
    while True:
        failed = reach(side.head, side.port, min(CONNECT_S, max(deadline - time.monotonic(), 0.1)))
        if not failed:
            where = f"{side.head}:{side.watch_port}"
            try:
                about = wire.request(side.head, side.watch_port, probe, REPLY_S, side.secret)
                break
            except OSError as error:
                failed = why_not(error) if not isinstance(error, wire.WireError) else str(error)
        if time.monotonic() + RETRY_S >= deadline:
            return [
                Check(
                    "peer",
                    "blocker",
                    f"the head {where} not reachable within {side.wait_s:g} s: {failed}; start "
                    "`sparkserve doctor` on the head (or its server) first; " + PORTS_NEEDED,
                )
            ]
        time.sleep(RETRY_S)
    doctor = about.get("doctor")
    if not isinstance(doctor, dict):  # the head's running server answered
        return [
            Check(
                "peer",
                "ok",
                f"the head's server runs: {side.head}:{side.port} accepts connections and its "
                f"watch answered on :{side.watch_port} (ephemeral ports untested: "
                "run both doctors before starting the pair)",
            ),
            identity_row(side.identity, about.get("identity") or {}, "the head's server"),
        ]
    problems = []
    spare = int(doctor.get("port", 0))
    failed = reach(side.head, spare)
    if failed:
        problems.append(f"this node could not reach the head's port {spare}: {failed}")
    if doctor.get("back") or not reached.wait(CONNECT_S):
        why = doctor.get("back") or "no connection"
        problems.append(f"the head could not reach this node's port {back_port}: {why}")
    if problems:
        peer = Check("peer", "blocker", "; ".join(problems) + "; " + PORTS_NEEDED)
    else:
        peer = Check(
            "peer",
            "ok",
            f"reached the head's doctor at {side.head}:{side.port}, :{side.watch_port} and "
            f"ephemeral port {spare}; it reached this node's ephemeral port {back_port}",
        )
    return [
        peer,
        identity_row(side.identity, about.get("identity") or {}, "the head"),
        link_row(side.link, doctor.get("link") or {}),
    ]


def pair_rows(side: Side) -> list[Check]:
    return head_rows(side) if side.rank == 0 else worker_rows(side)
