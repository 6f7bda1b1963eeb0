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

Every join and probe carries proof of the pair's shared secret (CLUSTER_SECRET, the same on
both nodes): "at" (Unix time), a fresh random "nonce" and "proof", the HMAC-SHA256 under the
secret of the rest of the message. The head answers only a message whose proof holds, that is
at most FRESH_S old and whose nonce it has not seen (a recorded message sent again is
refused). With CLUSTER_SECRET empty, anyone can make the proof: it then proves nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import time
from collections.abc import Mapping
from typing import Any

from sparkserve.memory.host import GIB, read_meminfo

BEAT_S = 1.0  # how often each side of a joined pair sends a beat
SECRET_ENV = "CLUSTER_SECRET"
# How old a signed message may be: the two clocks may differ this much (NTP keeps them well
# inside it), and a recorded message is refused once older, its nonce while younger.
FRESH_S = 60.0
NO_PROOF = "no valid proof of CLUSTER_SECRET (unset there, or not this pair's)"
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


def secret_of(env: Mapping[str, str] | None = None) -> bytes:
    """The pair's secret from the environment (the launcher's, compose's knob)."""
    return (os.environ if env is None else env).get(SECRET_ENV, "").encode()


def _mac(message: Message, secret: bytes) -> str:
    body = json.dumps(
        {k: v for k, v in message.items() if k != "proof"}, sort_keys=True, separators=(",", ":")
    )
    return hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()


def sign(message: Message, secret: bytes) -> Message:
    """`message` with its proof of `secret` (above)."""
    signed = {**message, "at": round(time.time(), 3), "nonce": secrets.token_hex(16)}
    signed["proof"] = _mac(signed, secret)
    return signed


class Nonces:
    """The nonces a listener has accepted within FRESH_S: a message sent again is refused."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}

    def problem(self, message: Message, secret: bytes, now: float | None = None) -> str | None:
        """Why `message` is not proven (one line), or None; a proven one's nonce is kept."""
        now = time.time() if now is None else now
        proof, at, nonce = message.get("proof"), message.get("at"), message.get("nonce")
        if not isinstance(proof, str) or not hmac.compare_digest(proof, _mac(message, secret)):
            return NO_PROOF
        if not isinstance(at, (int, float)) or abs(now - at) > FRESH_S:
            return f"its proof is not from the last {FRESH_S:g} s (a replay, or clocks apart)"
        self.seen = {n: t for n, t in self.seen.items() if now - t <= 2 * FRESH_S}
        if not isinstance(nonce, str) or nonce in self.seen:
            return "its proof was used before (a replay)"
        self.seen[nonce] = now
        return None


def request(
    host: str, port: int, message: Message, timeout: float, secret: bytes | None = None
) -> Message:
    """Connect, send one message signed with `secret` (default: CLUSTER_SECRET from the
    environment), return the one reply; WireError or OSError on failure."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        send(sock, sign(message, secret_of() if secret is None else secret))
        return LineReader(sock).receive(timeout)
