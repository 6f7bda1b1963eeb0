"""ROUTER_WORKERS parsing (sparkserve.router.workers): the forms a replica URL may take, their
one normal form (what vllm-router is given and matches on drain), and every refusal naming the
value and the allowed form."""

from __future__ import annotations

import pytest

from sparkserve.router.workers import normalise_worker, parse_workers


def test_commas_and_white_space_separate_and_each_url_is_normalised() -> None:
    text = " http://Spark-1.LAN:8000/,https://10.0.0.2:8443\n\thttp://[0:0::1]:8000  ,"
    assert parse_workers(text) == [
        "http://spark-1.lan:8000",
        "https://10.0.0.2:8443",
        "http://[::1]:8000",
    ]


def test_the_order_given_is_kept() -> None:
    assert parse_workers("http://b:2 http://a:1") == ["http://b:2", "http://a:1"]


def test_normal_form_is_stable() -> None:
    for url in ("HTTP://H:08000/", "http://h:8000", "http://h:8000/"):
        assert normalise_worker(url) == "http://h:8000"
        assert normalise_worker(normalise_worker(url)) == "http://h:8000"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("ftp://a:1", "scheme must be http or https"),
        ("grpc://a:1", "scheme must be http or https"),
        ("a:8000", "scheme must be http or https"),
        ("http://a", "no port"),
        ("http://[::1]", "no port"),
        ("http://a:", "port '' is not a number"),
        ("http://a:0", "port '0' is not a number from 1 to 65535"),
        ("http://a:65536", "port '65536' is not a number from 1 to 65535"),
        ("http://a:+80", "port '+80'"),
        ("http://a:80/v1", "a path (/v1) is not allowed"),
        ("http://a:80//", "a path (//) is not allowed"),
        ("http://a:80?x=1", "a query is not allowed"),
        ("http://a:80/?", "a query is not allowed"),
        ("http://a:80#top", "a fragment is not allowed"),
        ("http://key@a:80", "user information is not allowed"),
        ("http://u:p@a:80", "user information is not allowed"),
        ("http://:80", "no host"),
        ("http://a_b:80", "'a_b' is not a host name"),
        ("http://-a:80", "'-a' is not a host name"),
        ("http://999.1.1.1:80", "'999.1.1.1' is not an IPv4 address"),
        ("http://[::g]:80", "::g"),  # Python's urlsplit or ours names it
        ("http://[::1:80", "Invalid IPv6 URL"),
    ],
)
def test_a_bad_url_is_refused_in_one_line_naming_it(value: str, why: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_workers(f"http://ok:1, {value}")
    message = str(caught.value)
    assert "\n" not in message
    assert repr(value) in message
    assert why in message
    assert "allowed: http://HOST:PORT or https://HOST:PORT" in message


@pytest.mark.parametrize(
    ("text", "first", "again"),
    [
        ("http://a:80 http://a:80", "http://a:80", "http://a:80"),
        ("http://a:80 http://a:80/", "http://a:80", "http://a:80/"),
        ("http://Host:80, http://host:80", "http://Host:80", "http://host:80"),
        ("http://h:80 https://h:80", "http://h:80", "https://h:80"),
        ("http://h:80 http://h:0080", "http://h:80", "http://h:0080"),
        ("http://[::1]:80 http://[0::1]:80", "http://[::1]:80", "http://[0::1]:80"),
    ],
)
def test_the_same_replica_twice_is_refused(text: str, first: str, again: str) -> None:
    with pytest.raises(ValueError, match="the same replica as") as caught:
        parse_workers(text)
    assert f"worker URL {again!r}: the same replica as {first!r}" in str(caught.value)


@pytest.mark.parametrize("text", ["", "  ", " , ,\n"])
def test_no_url_at_all_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"^no worker URL given; allowed: one or more of http"):
        parse_workers(text)
