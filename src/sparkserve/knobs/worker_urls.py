"""Replica base URLs (ROUTER_WORKERS): parsed, checked and normalised (the knob's rule, here so
that the registry can apply it; sparkserve.router.workers is where the router code takes it).

vllm-router matches a worker by its URL string exactly (`/remove_worker`, the `worker` label of
its metrics), so every URL it is given, at start and on drain, goes through `normalise_worker`
and the same replica is always the same string: 'http://host:port', scheme and host lowercase,
no trailing slash.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

SCHEMES = ("http", "https")
ALLOWED = "http://HOST:PORT or https://HOST:PORT (a port from 1 to 65535, no path, query or user)"
# One DNS label: letters, digits and inner hyphens (RFC 1123); a name is labels joined by dots.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_SEPARATORS = re.compile(r"[\s,]+")


def _bad(value: str, why: str) -> ValueError:
    return ValueError(f"worker URL {value!r}: {why}; allowed: {ALLOWED}")


def _host(value: str, host: str) -> str:
    """The host part lowercased (an IPv6 address in brackets, compressed), or ValueError."""
    if host.startswith("["):
        if not host.endswith("]"):
            raise _bad(value, "unbalanced brackets around an IPv6 address")
        try:
            return f"[{ipaddress.IPv6Address(host[1:-1]).compressed}]"
        except ValueError:
            raise _bad(value, f"{host} is not an IPv6 address") from None
    host = host.lower()
    if not host:
        raise _bad(value, "no host")
    if not _HOSTNAME.fullmatch(host) or len(host) > 253:
        raise _bad(value, f"{host!r} is not a host name or IPv4 address")
    if host.replace(".", "").isdigit():  # all digits: only a dotted IPv4 address reads so
        try:
            return str(ipaddress.IPv4Address(host))
        except ValueError:
            raise _bad(value, f"{host!r} is not an IPv4 address") from None
    return host


def normalise_worker(value: str) -> str:
    """One replica's base URL as 'scheme://host:port', or ValueError (one line) naming it."""
    try:
        parts = urlsplit(value)
    except ValueError as error:  # e.g. an unbalanced '[' ("Invalid IPv6 URL")
        raise _bad(value, str(error)) from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES or not value.lower().startswith(f"{scheme}://"):
        raise _bad(value, "the scheme must be http or https")
    if parts.query or "?" in value:
        raise _bad(value, "a query is not allowed")
    if parts.fragment or "#" in value:
        raise _bad(value, "a fragment is not allowed")
    if parts.path not in ("", "/"):
        raise _bad(value, f"a path ({parts.path}) is not allowed: the router adds the API path")
    netloc = parts.netloc
    if "@" in netloc:
        raise _bad(value, "user information is not allowed (the API key is not sent in the URL)")
    host, colon, port = netloc.rpartition(":")
    if not colon or (host.startswith("[") and not host.endswith("]")) or netloc.endswith("]"):
        raise _bad(value, "no port: the port must be given")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise _bad(value, f"port {port!r} is not a number from 1 to 65535")
    return f"{scheme}://{_host(value, host)}:{int(port)}"


def parse_workers(text: str) -> list[str]:
    """ROUTER_WORKERS: URLs separated by commas or white space, each normalised; at least one,
    and no replica twice (the same host and port, whatever the scheme: a port speaks one)."""
    values = [item for item in _SEPARATORS.split(text.strip()) if item]
    if not values:
        raise ValueError(f"no worker URL given; allowed: one or more of {ALLOWED}")
    seen: dict[str, str] = {}
    workers = []
    for value in values:
        url = normalise_worker(value)
        address = url.split("://", 1)[1]
        if address in seen:
            raise _bad(value, f"the same replica as {seen[address]!r}: each replica once")
        seen[address] = value
        workers.append(url)
    return workers
