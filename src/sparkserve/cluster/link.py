"""Check this machine's side of the pair's link before anything starts.

With CLUSTER_NODES=2 the head's address and this node's interface must describe one network
that exists here: the interface is present, up and has an IPv4 address; the head's address
lies in that interface's network; on the head it is the interface's own address, on the
worker it is not. Each failure is one KnobError line naming the knob, its value and what
was found, so that the launcher stops before loading anything.
"""

from __future__ import annotations

import ipaddress
import math
import socket
from collections.abc import Mapping

import psutil

from sparkserve.knobs import KnobError

ROLES = {0: "the head (CLUSTER_RANK=0)", 1: "the worker (CLUSTER_RANK=1)"}


def _ipv4_networks(iface: str) -> list[ipaddress.IPv4Interface]:
    """The interface's IPv4 addresses with their networks."""
    found = []
    for address in psutil.net_if_addrs().get(iface, []):
        if address.family == socket.AF_INET and address.netmask:
            found.append(ipaddress.IPv4Interface(f"{address.address}/{address.netmask}"))
    return found


def _interface(iface: str) -> list[ipaddress.IPv4Interface]:
    """The interface's IPv4 networks; KnobError if it is missing, down or has none."""
    names = sorted(psutil.net_if_addrs())
    if iface not in names:
        raise KnobError(
            f"CLUSTER_IFACE={iface!r}: no such interface here (have: {', '.join(names)})"
        )
    stats = psutil.net_if_stats().get(iface)
    flags = stats.flags.split(",") if stats is not None else []
    if "up" not in flags:
        raise KnobError(
            f"CLUSTER_IFACE={iface!r}: the interface is down (bring it up: ip link set {iface} up)"
        )
    if "running" not in flags:
        raise KnobError(
            f"CLUSTER_IFACE={iface!r}: the interface is up but has no link (no carrier: check "
            "the cable and the other machine's port)"
        )
    networks = _ipv4_networks(iface)
    if not networks:
        raise KnobError(
            f"CLUSTER_IFACE={iface!r}: the interface has no IPv4 address (give both nodes an "
            "address in one network on the link)"
        )
    return networks


def _head_address(text: str) -> ipaddress.IPv4Address:
    if not text:
        raise KnobError(
            "CLUSTER_HEAD_ADDR='': required with CLUSTER_NODES=2 (the head's IPv4 address on "
            "the link)"
        )
    try:
        return ipaddress.IPv4Address(text)
    except ipaddress.AddressValueError:
        raise KnobError(
            f"CLUSTER_HEAD_ADDR={text!r}: not an IPv4 address (four numbers from 0 to 255)"
        ) from None


def host_ip(values: Mapping[str, str]) -> str:
    """This node's address on the link, after checking the link's knobs (KnobError)."""
    head = _head_address(values["CLUSTER_HEAD_ADDR"])
    iface = values["CLUSTER_IFACE"]
    if not iface:
        raise KnobError(
            "CLUSTER_IFACE='': required with CLUSTER_NODES=2 (this machine's network interface "
            "on the link)"
        )
    networks = _interface(iface)
    have = ", ".join(str(network) for network in networks)
    on_link = [network for network in networks if head in network.network]
    if not on_link:
        raise KnobError(
            f"CLUSTER_HEAD_ADDR={str(head)!r}: not in the network of CLUSTER_IFACE={iface!r} "
            f"(have: {have})"
        )
    rank = int(values["CLUSTER_RANK"])
    own = any(network.ip == head for network in networks)
    if rank == 0 and not own:
        raise KnobError(
            f"CLUSTER_HEAD_ADDR={str(head)!r}: on {ROLES[0]} it must be this machine's own "
            f"address on CLUSTER_IFACE={iface!r} (have: {have})"
        )
    if rank == 1 and own:
        raise KnobError(
            f"CLUSTER_HEAD_ADDR={str(head)!r}: on {ROLES[1]} it must be the head's address, "
            f"not this machine's own on CLUSTER_IFACE={iface!r}"
        )
    return str(head) if rank == 0 else str(on_link[0].ip)


def _ports(values: Mapping[str, str]) -> None:
    """The engine's rendezvous port, the watch's and (on the head) the API's must differ."""
    named = {
        "CLUSTER_PORT": values["CLUSTER_PORT"],
        "CLUSTER_WATCH_PORT": values["CLUSTER_WATCH_PORT"],
    }
    if values["CLUSTER_RANK"] == "0":
        named["PORT"] = values["PORT"]
    seen: dict[str, str] = {}
    for name, port in named.items():
        if port in seen:
            raise KnobError(f"{name}={port!r}: the same port as {seen[port]}; give each its own")
        seen[port] = name


def cluster_exports(values: Mapping[str, str]) -> dict[str, str]:
    """What the launcher needs for the pair: CLUSTER_HOST_IP (this node's address on the link,
    empty on one node) and CLUSTER_DIST_TIMEOUT_S (vLLM's bound on its own rendezvous and
    collectives: as long as a node waits for its peer)."""
    if values["CLUSTER_NODES"] != "2":
        return {"CLUSTER_HOST_IP": "", "CLUSTER_DIST_TIMEOUT_S": ""}
    address = host_ip(values)
    _ports(values)
    timeout = str(math.ceil(float(values["CLUSTER_JOIN_TIMEOUT_S"])))
    return {"CLUSTER_HOST_IP": address, "CLUSTER_DIST_TIMEOUT_S": timeout}
