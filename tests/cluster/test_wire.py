"""The pair's line protocol over a real socket pair."""

from __future__ import annotations

import socket
import threading

import pytest

from sparkserve.cluster.wire import (
    FRESH_S,
    NO_PROOF,
    LineReader,
    Nonces,
    WireError,
    decode,
    encode,
    request,
    send,
    sign,
)


def test_messages_cross_a_socket_whole_and_in_order() -> None:
    left, right = socket.socketpair()
    with left, right:
        send(left, {"kind": "beat", "memory": {"available_gib": 3.5}})
        left.sendall(encode({"kind": "bye", "reason": "done"})[:5])
        reader = LineReader(right)
        assert reader.receive(1.0) == {"kind": "beat", "memory": {"available_gib": 3.5}}
        left.sendall(encode({"kind": "bye", "reason": "done"})[5:])
        assert reader.receive(1.0) == {"kind": "bye", "reason": "done"}


def test_silence_a_close_and_foreign_bytes_are_errors() -> None:
    left, right = socket.socketpair()
    with right:
        reader = LineReader(right)
        with pytest.raises(WireError, match=r"no message for 0\.2 s"):
            reader.receive(0.2)
        left.sendall(b"GET / HTTP/1.1\r\n")
        with pytest.raises(WireError, match="not a sparkserve message"):
            reader.receive(1.0)
        left.close()
        with pytest.raises(WireError, match="closed"):
            reader.receive(1.0)
    with pytest.raises(WireError):
        decode(b'{"no": "kind"}')


def test_a_message_already_waiting_counts_when_no_time_is_left() -> None:
    """A reader that was not scheduled until after its deadline still finds what arrived."""
    left, right = socket.socketpair()
    with left, right:
        send(left, {"kind": "beat", "memory": {}})
        assert LineReader(right).receive(0.0) == {"kind": "beat", "memory": {}}
        with pytest.raises(WireError, match="no message for 0 s"):
            LineReader(right).receive(0.0)


def test_request_gets_the_one_reply() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        connection, _ = server.accept()
        with connection:
            asked = LineReader(connection).receive(2.0)
            send(connection, {"kind": "about", "asked": asked["kind"]})

    thread = threading.Thread(target=answer)
    thread.start()
    try:
        assert request("127.0.0.1", port, {"kind": "probe"}, 2.0) == {
            "kind": "about",
            "asked": "probe",
        }
    finally:
        thread.join()
        server.close()


def test_a_proof_holds_only_under_the_secret_fresh_and_once() -> None:
    secret = b"pair-secret-0123456789"
    signed = sign({"kind": "join", "rank": 1, "identity": {"image": "cpu"}}, secret)
    assert Nonces().problem(signed, b"another-secret-012345") == NO_PROOF
    assert Nonces().problem({**signed, "rank": 0}, secret) == NO_PROOF  # altered on the way
    assert Nonces().problem({k: v for k, v in signed.items() if k != "proof"}, secret) == NO_PROOF
    late = Nonces().problem(signed, secret, now=signed["at"] + FRESH_S + 1)
    assert late is not None and "a replay, or clocks apart" in late
    nonces = Nonces()
    assert nonces.problem(signed, secret) is None
    assert nonces.problem(signed, secret) == "its proof was used before (a replay)"
    assert nonces.problem(sign({"kind": "join"}, secret), secret) is None  # a new nonce
