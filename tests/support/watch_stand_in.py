"""A small TCP server speaking the pair's wire protocol as the head's watch answers probes
(cluster.wire): scripted `about` answers with both hosts' memory readings."""

from __future__ import annotations

import socket
import threading
from typing import Any

from sparkserve.cluster import wire


def reading(available: float, swap: float = 0.0) -> dict[str, float]:
    return {"available_gib": available, "total_gib": 119.7, "swap_used_gib": swap, "at": 0.0}


class WatchStandIn:
    """Answers each probe with the next scripted answer (the last one repeats); a bytes
    answer is sent raw. Records what it was asked."""

    def __init__(self, answers: list[dict[str, Any] | bytes]) -> None:
        self.answers = answers
        self.asked: list[dict[str, Any]] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.server.settimeout(0.2)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            with connection:
                self.asked.append(wire.LineReader(connection).receive(2.0))
                answer = self.answers[min(len(self.asked), len(self.answers)) - 1]
                connection.sendall(answer if isinstance(answer, bytes) else wire.encode(answer))

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        self.server.close()


def about(head: float, worker: float | None, worker_swap: float = 0.0) -> dict[str, Any]:
    memory = {"0": reading(head)}
    if worker is not None:
        memory["1"] = reading(worker, worker_swap)
    return {"kind": "about", "rank": 0, "identity": {}, "memory": memory}


def pair_env(port: int) -> dict[str, str]:
    """The knobs of a pair whose head's watch is this machine's `port`."""
    return {"CLUSTER_NODES": "2", "CLUSTER_HEAD_ADDR": "127.0.0.1", "CLUSTER_WATCH_PORT": str(port)}
