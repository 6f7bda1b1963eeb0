"""`sparkserve cluster watch`: each node of a pair watches the other; a failure stops both.

vLLM's multi-node engine leaves a broken pair hanging: a dead worker leaves the head healthy
until the next request, a stopped head leaves the worker up, a cut link hangs both in a
collective (docs/CLUSTER.md). The launcher starts this watch in the background on each node,
watching its own PID (the launcher waits on vLLM as its child), and starts vLLM only once the
pair has joined.

- The head listens on CLUSTER_HEAD_ADDR:CLUSTER_WATCH_PORT; the worker connects (retrying
  while the head is not listening yet, failing at once when the address is unreachable) and
  joins; the head refuses a worker whose software differs (sparkserve.cluster.identity), and
  any join or probe without proof of CLUSTER_SECRET (sparkserve.cluster.wire): it logs the
  refusal and goes on waiting, so that no one but a worker of this pair can end its wait.
- Joined, both send a beat with their host's memory every wire.BEAT_S. A peer silent for
  --peer-timeout-s, a bye, a closed connection, this node's vLLM gone or this watch stopped:
  one line naming the node that failed and why, a bye to the peer if it can still hear it,
  this node's vLLM stopped at once (stopping.stop: no drain; SIGKILL below its API server,
  SIGTERM to it, SIGKILL to it after --grace-s),
  exit EXIT_STOPPED.
- The head answers `probe` with `about` (both nodes' latest memory) at any time.
- The state file (JSON) says where the watch is; the launcher waits for "joined" in it and
  `sparkserve cluster health` reads it.

Messages are sparkserve.cluster.wire's; no model traffic passes here.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import faulthandler
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkserve.cluster import wire
from sparkserve.cluster.identity import differences, node_identity
from sparkserve.command_line import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_STOPPED,
    one_line_errors,
    sigterm_when_parent_dies,
    standalone,
)
from sparkserve.guard.stopping import Tree, stop

PROG = "sparkserve cluster watch"
STATE_NAME = "cluster-watch.json"
GREETING_S = 5.0  # a connection must say what it wants within this
CONNECT_S = 5.0  # one connection attempt to the head
PROGRESS_S = 15.0  # how often a waiting node says it still waits
TICK_S = 0.1
STALL_S = 1.0  # a main-loop tick this late means this watch itself was not running
# connect() errors that mean no machine answers at that address (as opposed to a machine
# that answers but has no watch listening yet: ECONNREFUSED).
UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN}


def state_path(env: Mapping[str, str]) -> Path:
    """Where the launcher's watch keeps its state: SPARKSERVE_STATE_DIR (a folder inside the
    container), else the temp folder."""
    folder = env.get("SPARKSERVE_STATE_DIR") or env.get("TMPDIR") or "/tmp"
    return Path(folder) / STATE_NAME


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{PROG}: {stamp} {message}", file=sys.stderr, flush=True)


class Stop(Exception):
    """The watch ends: a one-line reason and the exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Options:
    pid: int
    rank: int
    head_addr: str
    host_ip: str
    port: int
    peer_timeout_s: float
    join_timeout_s: float
    grace_s: float
    state_file: Path
    api_url: str


class Watch:
    def __init__(self, options: Options, identity: dict[str, str], secret: bytes) -> None:
        self.o = options
        self.identity = identity
        self.secret = secret
        self.nonces = wire.Nonces()
        self.peer_rank = 1 - options.rank
        self.peer_addr = options.head_addr if options.rank == 1 else "?"
        self.lock = threading.Lock()
        self.memory: dict[str, dict[str, float]] = {str(options.rank): wire.reading()}
        self.phase = "waiting"
        self.peer_seen = 0.0  # time.time() of the last message from the peer (state file)
        self.heard = 0.0  # time.monotonic() of the same
        # SIGTERM only sets this flag: a handler that takes a lock (Event.set does) deadlocks
        # when a second SIGTERM lands while the first one holds it. The main thread reads the
        # flag; `terminated` (set by the main thread alone) tells the helper threads to end.
        self.sigterm = False
        self.terminated = threading.Event()
        self.tree = Tree(options.pid)

    def got_sigterm(self) -> None:
        self.sigterm = True

    def node(self, rank: int) -> str:
        address = self.o.host_ip if rank == self.o.rank else self.peer_addr
        return f"node {rank} ({address})"

    # ------------------------------------------------------------ state file

    def write_state(self, reason: str = "") -> None:
        with self.lock:
            state = {
                "state": self.phase,
                "rank": self.o.rank,
                "watch_pid": os.getpid(),
                "peer": self.peer_addr,
                "peer_seen_at": self.peer_seen,
                "peer_timeout_s": self.o.peer_timeout_s,
                "api": self.o.api_url,
                "memory": self.memory,
                "reason": reason,
            }
        temporary = self.o.state_file.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            temporary.write_text(json.dumps(state, separators=(",", ":")) + "\n")
            temporary.replace(self.o.state_file)

    # ------------------------------------------------------------ joining

    def local_gone(self) -> bool:
        return not self.tree.top_alive()

    def check_waiting(self, since: float, said: list[float], what: str) -> None:
        """While waiting for the peer: stop if this node's launcher went away or the join
        timeout ran out; say every PROGRESS_S that we still wait."""
        if self.local_gone() or self.sigterm:
            raise Stop("the launcher stopped before the pair joined", EXIT_FAILED)
        waited = time.monotonic() - since
        if waited >= self.o.join_timeout_s:
            raise Stop(
                f"{what}: no pair after {self.o.join_timeout_s:g} s (CLUSTER_JOIN_TIMEOUT_S); "
                "start the other node, or check its log",
                EXIT_BAD_INPUT,
            )
        if waited - said[0] >= PROGRESS_S:
            said[0] = waited
            log(f"{what}: still waiting, {waited:.0f} s of {self.o.join_timeout_s:g}")

    def join_as_worker(self) -> tuple[socket.socket, wire.LineReader]:
        target = f"{self.o.head_addr}:{self.o.port}"
        since, said, last_error = time.monotonic(), [0.0], ""
        log(f"node 1 ({self.o.host_ip}): joining the head at {target}")
        while True:
            self.check_waiting(since, said, f"waiting for the head at {target} ({last_error})")
            try:
                sock = socket.create_connection(
                    (self.o.head_addr, self.o.port), CONNECT_S, (self.o.host_ip, 0)
                )
            except ConnectionRefusedError:
                last_error = "connection refused: its watch is not listening yet"
                time.sleep(1.0)
                continue
            except TimeoutError:
                raise Stop(
                    f"CLUSTER_HEAD_ADDR={self.o.head_addr!r}: no answer from {target} within "
                    f"{CONNECT_S:g} s: no head at that address, or a firewall drops the link",
                    EXIT_BAD_INPUT,
                ) from None
            except OSError as error:
                if error.errno in UNREACHABLE:
                    raise Stop(
                        f"CLUSTER_HEAD_ADDR={self.o.head_addr!r}: unreachable "
                        f"({error.strerror}): no machine answers at that address on the link",
                        EXIT_BAD_INPUT,
                    ) from None
                last_error = error.strerror or str(error)
                time.sleep(1.0)
                continue
            reader = wire.LineReader(sock)
            try:
                join = {"kind": "join", "rank": 1, "identity": self.identity}
                wire.send(sock, wire.sign(join, self.secret))
                answer = reader.receive(max(self.o.peer_timeout_s, GREETING_S))
            except OSError as error:
                sock.close()
                last_error = f"the head did not answer the join: {error}"
                time.sleep(1.0)
                continue
            if answer["kind"] == "refused":
                sock.close()
                raise Stop(f"the head at {target} refused this node: {answer.get('reason')}",
                           EXIT_BAD_INPUT)  # fmt: skip
            if answer["kind"] != "welcome":
                sock.close()
                raise Stop(f"{target} answered {answer['kind']!r}, not a sparkserve head",
                           EXIT_BAD_INPUT)  # fmt: skip
            return sock, reader

    def listen(self) -> socket.socket:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((self.o.head_addr, self.o.port))
        except OSError as error:
            server.close()
            raise Stop(
                f"CLUSTER_WATCH_PORT={self.o.port}: cannot listen on {self.o.head_addr} "
                f"({error.strerror})",
                EXIT_BAD_INPUT,
            ) from None
        server.listen(8)
        server.settimeout(0.5)
        return server

    def serve(self, server: socket.socket, joins: queue.Queue[Any]) -> None:
        """The head's listener thread: probes get an answer here, joins go to the main loop."""
        while not self.terminated.is_set():
            try:
                conn, (address, _) = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self.greet, args=(conn, address, joins), daemon=True).start()

    def about(self) -> wire.Message:
        with self.lock:
            self.memory[str(self.o.rank)] = wire.reading()
            memory = dict(self.memory)
        return {"kind": "about", "rank": self.o.rank, "identity": self.identity, "memory": memory}

    def greet(self, conn: socket.socket, address: str, joins: queue.Queue[Any]) -> None:
        reader = wire.LineReader(conn)
        try:
            message = reader.receive(GREETING_S)
            if message["kind"] in ("probe", "join"):
                with self.lock:
                    problem = self.nonces.problem(message, self.secret)
                if problem is not None:
                    log(f"refused a {message['kind']} from {address}: {problem}")
                    wire.send(conn, {"kind": "refused", "reason": problem})
                    conn.close()
                    return
            if message["kind"] == "probe":
                wire.send(conn, self.about())
            elif message["kind"] == "join":
                joins.put((conn, reader, address, message))
                return
        except OSError:
            pass
        conn.close()

    def accept_worker(self, joins: queue.Queue[Any]) -> tuple[socket.socket, wire.LineReader]:
        since, said = time.monotonic(), [0.0]
        target = f"{self.o.head_addr}:{self.o.port}"
        log(f"node 0 ({self.o.host_ip}): waiting for the worker on {target}")
        while True:
            self.check_waiting(since, said, f"waiting for the worker on {target}")
            try:
                conn, reader, address, message = joins.get(timeout=0.5)
            except queue.Empty:
                continue
            problems = differences(self.identity, message.get("identity") or {})
            if problems:
                # the worker stops on the refusal; the head waits on for one that matches
                reason = "its software differs (here = head): " + "; ".join(problems)
                with contextlib.suppress(OSError):
                    wire.send(conn, {"kind": "refused", "reason": reason})
                conn.close()
                log(f"node 1 ({address}) refused: {reason}; still waiting for a worker")
                continue
            self.peer_addr = address
            wire.send(conn, {"kind": "welcome", "identity": self.identity})
            return conn, reader

    def refuse_more(self, joins: queue.Queue[Any]) -> None:
        """A second worker while one is joined is refused (and changes nothing)."""
        while not self.terminated.is_set():
            try:
                conn, _, _, _ = joins.get(timeout=0.5)
            except queue.Empty:
                continue
            with contextlib.suppress(OSError):
                reason = f"a worker is joined already ({self.peer_addr})"
                wire.send(conn, {"kind": "refused", "reason": reason})
            conn.close()

    # ------------------------------------------------------------ joined

    def listen_to_peer(self, reader: wire.LineReader, failures: queue.Queue[str]) -> None:
        """Reader thread: beats refresh the peer's memory; a bye or a closed connection is a
        failure. Silence is the main loop's to judge."""
        while not self.terminated.is_set():
            try:
                message = reader.receive(self.o.peer_timeout_s + 1.0)
            except wire.WireError as error:
                if "closed" in str(error) or time.time() - self.peer_seen < self.o.peer_timeout_s:
                    failures.put(f"{error}: its watch is gone (killed, or its host is down)")
                    return
                continue
            except OSError as error:
                failures.put(f"the connection broke ({error.strerror or error})")
                return
            with self.lock:
                self.peer_seen, self.heard = time.time(), time.monotonic()
                if message["kind"] == "beat" and isinstance(message.get("memory"), dict):
                    self.memory[str(self.peer_rank)] = message["memory"]
            if message["kind"] == "bye":
                failures.put(str(message.get("reason", "stopped")))
                return

    def run_joined(self, sock: socket.socket, reader: wire.LineReader) -> Stop:
        """Beat until something fails; returns why (the peer's or this node's fault)."""
        with self.lock:
            self.phase = "joined"
            self.peer_seen, self.heard = time.time(), time.monotonic()
        log(f"pair joined: {self.node(0)} head, {self.node(1)} worker")
        failures: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self.listen_to_peer, args=(reader, failures), daemon=True).start()
        threading.Thread(target=self.beat, args=(sock,), daemon=True).start()
        next_look = 0.0
        # Silence is counted only while this watch runs: after a stall of its own (a host too
        # busy to schedule it), the peer's beats may still sit unread in the socket, so the
        # peer gets a whole timeout again from the moment this watch resumed.
        counting_from = last_tick = time.monotonic()
        while True:
            with contextlib.suppress(queue.Empty):
                return Stop(f"{self.node(self.peer_rank)}: {failures.get(timeout=TICK_S)}",
                            EXIT_STOPPED)  # fmt: skip
            if self.local_gone():
                return self.local_stop(sock, "vLLM exited")
            if self.sigterm:
                return self.local_stop(sock, "its watch got SIGTERM (the node is stopping)")
            now = time.monotonic()
            if now - last_tick > STALL_S:
                counting_from = now
            last_tick = now
            with self.lock:
                silent = now - max(self.heard, counting_from)
            if silent > self.o.peer_timeout_s:
                return Stop(
                    f"{self.node(self.peer_rank)}: no heartbeat for {silent:.0f} s "
                    f"(CLUSTER_PEER_TIMEOUT_S={self.o.peer_timeout_s:g}): link down or host "
                    "gone",
                    EXIT_STOPPED,
                )
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + wire.BEAT_S
                mine = wire.reading()
                with self.lock:
                    self.memory[str(self.o.rank)] = mine
                self.tree.refresh()
                self.write_state()

    def beat(self, sock: socket.socket) -> None:
        """Beat thread: nothing but the beats, so that slow reads of /proc in the main loop
        (a busy host) never make this node look silent."""
        while not self.terminated.is_set():
            try:
                with self.lock:
                    wire.send(sock, {"kind": "beat", "memory": self.memory[str(self.o.rank)]})
            except OSError:  # a dead link shows as silence, a closed one to the reader
                return
            self.terminated.wait(wire.BEAT_S)

    def local_stop(self, sock: socket.socket, why: str) -> Stop:
        """This node failed: tell the peer (the bye names this node), then stop."""
        with contextlib.suppress(OSError), self.lock:
            wire.send(sock, {"kind": "bye", "reason": why})
        return Stop(f"{self.node(self.o.rank)}: {why}", EXIT_STOPPED)

    # ------------------------------------------------------------ the whole run

    def run(self) -> int:
        self.write_state()
        joins: queue.Queue[Any] = queue.Queue()
        sock: socket.socket | None = None
        try:
            if self.o.rank == 0:
                server = self.listen()
                threading.Thread(target=self.serve, args=(server, joins), daemon=True).start()
                sock, reader = self.accept_worker(joins)
                threading.Thread(target=self.refuse_more, args=(joins,), daemon=True).start()
            else:
                sock, reader = self.join_as_worker()
            outcome = self.run_joined(sock, reader)
        except Stop as stopped:
            outcome = stopped
        if sock is not None:  # a bye went out already where the peer can use one
            sock.close()
        return self.finish(outcome)

    def finish(self, outcome: Stop) -> int:
        with self.lock:
            self.phase = "stopped"
        if outcome.status == EXIT_STOPPED:
            log(f"{outcome}; stopping this node's vLLM")
            started = time.monotonic()
            how = stop(self.tree, self.o.grace_s)
            log(f"vLLM (pid {self.o.pid}) {how}, {time.monotonic() - started:.1f} s")
        elif outcome.status != EXIT_FAILED or not self.local_gone():
            log(str(outcome))
        self.write_state(str(outcome))
        self.terminated.set()
        return outcome.status


def _die_with_parent(pid: int, on_signal: Callable[[], None]) -> None:
    """SIGTERM (from anyone, or from the kernel when our parent, the watched process, dies)
    only sets a flag: the main loop decides what it means."""
    signal.signal(signal.SIGTERM, lambda *_: on_signal())
    if os.getppid() == pid and not sigterm_when_parent_dies(pid):
        on_signal()


def configure(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--pid", type=int, required=True, help="the process to stop (the launcher's $$)")
    add("--rank", type=int, choices=(0, 1), required=True, help="0 head, 1 worker")
    add("--head-addr", required=True, help="the head's address on the link")
    add("--host-ip", required=True, help="this node's address on the link")
    add("--port", type=int, required=True, help="the head's watch port")
    add("--peer-timeout-s", type=float, default=5.0, help="silence that counts as a lost peer")
    add("--join-timeout-s", type=float, default=600.0, help="how long to wait for the peer")
    add("--grace-s", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    add("--state-file", type=Path, default=None, help="default: " + STATE_NAME + " in "
        "$SPARKSERVE_STATE_DIR or the temp folder")  # fmt: skip
    add("--api-url", default="", help="the head's API (for `sparkserve cluster health`)")
    one_line_errors(parser, PROG)


def run(args: argparse.Namespace) -> int:
    options = Options(
        pid=args.pid, rank=args.rank, head_addr=args.head_addr, host_ip=args.host_ip,
        port=args.port, peer_timeout_s=args.peer_timeout_s, join_timeout_s=args.join_timeout_s,
        grace_s=args.grace_s, state_file=args.state_file or state_path(os.environ),
        api_url=args.api_url,
    )  # fmt: skip
    watch = Watch(options, node_identity(os.environ), wire.secret_of(os.environ))
    _die_with_parent(args.pid, watch.got_sigterm)
    # `kill -USR1 <watch>` writes every thread's stack to its log: a watch that looks stuck.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Best effort (root only): a beat must not wait behind vLLM's busy threads on a loaded
    # host, and the OOM killer should pick the watch last.
    with contextlib.suppress(OSError):
        os.nice(-10)
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text("-500")
    return watch.run()


def main(argv: list[str] | None = None) -> int:
    return standalone(PROG, __doc__ or PROG, configure, run, argv)


if __name__ == "__main__":
    sys.exit(main())
