"""The pair's own messages: one JSON object per line over TCP, each with a "kind".

This carries no model traffic (vLLM's engine does, over torch.distributed); only what keeps
the two nodes honest with each other: who they are, that they are alive, their memory, and
why one of them stops. Kinds:

- join (worker -> head's watch): {"rank", "identity"}; answered by welcome {"identity"} or
  refused {"reason"}; then both sides send beat {"memory"} every BEAT_S, and bye {"reason"}
  when they stop.
- probe (anyone -> a listening node): {"identity"?}; answered by one about {"rank",
  "identity", "memory": {rank: reading}} and the connection closes. `sparkserve doctor` and
  `stress_mem.sh` use it.

A reading is {"available_gib", "total_gib", "swap_used_gib", "at"} (`at`: Unix time).
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from sparkserve.memory.host import GIB, read_meminfo

BEAT_S = 1.0  # how often each side of a joined pair sends a beat
MAX_LINE = 64 * 1024  # a longer line is a peer speaking something else

Message = dict[str, Any]


class WireError(OSError):
    """The peer closed, went silent, or sent something that is not one of our messages."""


def reading() -> dict[str, float]:
    """This host's memory now, as a reading (above)."""
    memory = read_meminfo()
    return {
        "available_gib": round(memory.available / GIB, 3),
        "total_gib": round(memory.total / GIB, 3),
        "swap_used_gib": round(memory.swap_used / GIB, 3),
        "at": round(time.time(), 3),
    }


def encode(message: Message) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def send(sock: socket.socket, message: Message) -> None:
    sock.sendall(encode(message))


class LineReader:
    """Reads whole messages from a socket; `receive` waits at most `timeout` seconds."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def receive(self, timeout: float) -> Message:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_LINE:
                raise WireError(f"a line longer than {MAX_LINE} bytes: not a sparkserve peer")
            # Out of time, one last look without waiting: a message that arrived while this
            # process was not scheduled is in the socket, and counts.
            left = deadline - time.monotonic()
            self.sock.settimeout(max(left, 0.0))
            try:
                chunk = self.sock.recv(4096)
            except (TimeoutError, BlockingIOError):
                if left <= 0:
                    raise WireError(f"no message for {timeout:g} s") from None
                continue
            if not chunk:
                raise WireError("the peer closed the connection")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return decode(line)


def decode(line: bytes) -> Message:
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise WireError(f"not a sparkserve message: {line[:80]!r}") from error
    if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
        raise WireError(f"not a sparkserve message: {line[:80]!r}")
    return message


def request(host: str, port: int, message: Message, timeout: float) -> Message:
    """Connect, send one message, return the one reply; WireError or OSError on failure."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        send(sock, message)
        return LineReader(sock).receive(timeout)
