"""Which address each node of a pair uses on the link, from psutil's view of this host.

Pure functions over `psutil.net_if_addrs()` (a name -> addresses mapping; each address has
`family`, `address` and `netmask`), so that the launcher and `sparkserve doctor` apply the
same rules and a test can hand them any host it likes. The rules:

- CLUSTER_IFACE exists, is up and has a carrier;
- CLUSTER_HEAD_ADDR is one IPv4 address, not unspecified, multicast or broadcast (on the
  worker, nor the network or broadcast address of the link's network)
  (link-local 169.254.x.x is fine: NVIDIA's automatic netplan for two Sparks gives those;
  loopback is allowed for a rehearsal of both roles on one machine over `lo`);
- CLUSTER_IFACE exists on this host and has an IPv4 address;
- on the head (rank 0) CLUSTER_HEAD_ADDR is one of CLUSTER_IFACE's addresses;
- on the worker (rank 1) it is none of this host's addresses and lies in the network of one
  of CLUSTER_IFACE's addresses (else the engine's traffic would leave by another interface);
  that address of CLUSTER_IFACE is the worker's own address on the link.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping, Sequence
from ipaddress import IPv4Address, IPv4Interface
from typing import Any


class AddressError(ValueError):
    """The pair's addresses do not fit this host; the message is one line."""


def interface_problem(iface: str, stats: Mapping[str, Any]) -> str | None:
    """Why CLUSTER_IFACE cannot carry the pair (missing, down, no carrier), in one line, or
    None. `stats` is `psutil.net_if_stats()` (each entry's `flags` holds up and running)."""
    if not iface:
        return (
            "CLUSTER_IFACE='': required with CLUSTER_NODES=2 (this machine's network interface "
            "on the link)"
        )
    if iface not in stats:
        known = ", ".join(sorted(stats)) or "none"
        return f"CLUSTER_IFACE={iface!r}: no such interface here (have: {known})"
    flags = stats[iface].flags.split(",")
    if "up" not in flags:
        return (
            f"CLUSTER_IFACE={iface!r}: the interface is down (bring it up: ip link set {iface} up)"
        )
    if "running" not in flags:
        return (
            f"CLUSTER_IFACE={iface!r}: the interface is up but has no link (no carrier: check "
            "the cable and the other machine's port)"
        )
    return None


def head_address(text: str) -> IPv4Address:
    """CLUSTER_HEAD_ADDR parsed, or AddressError naming it and the rule."""
    if not text.strip():
        raise AddressError("CLUSTER_HEAD_ADDR is empty: required with CLUSTER_NODES=2")
    try:
        address = IPv4Address(text.strip())
    except ValueError:
        raise AddressError(f"CLUSTER_HEAD_ADDR={text!r}: must be an IPv4 address") from None
    if address.is_unspecified or address.is_multicast or address == IPv4Address("255.255.255.255"):
        raise AddressError(
            f"CLUSTER_HEAD_ADDR={text!r}: must be the head's address on the link, "
            "not unspecified, multicast or broadcast"
        )
    return address


def ipv4_interfaces(addrs: Mapping[str, Sequence[Any]], iface: str) -> list[IPv4Interface]:
    """The IPv4 addresses (with their networks) of one interface; [] when it has none."""
    found = []
    for entry in addrs.get(iface, ()):
        if entry.family == socket.AF_INET and entry.netmask:
            found.append(ipaddress.ip_interface(f"{entry.address}/{entry.netmask}"))
    return [item for item in found if isinstance(item, IPv4Interface)]


def owner_of(addrs: Mapping[str, Sequence[Any]], address: IPv4Address) -> str | None:
    """The interface of this host that has `address`, if any."""
    for name in addrs:
        if any(item.ip == address for item in ipv4_interfaces(addrs, name)):
            return name
    return None


def link_address(
    rank: int, head: str, iface: str, addrs: Mapping[str, Sequence[Any]]
) -> IPv4Interface:
    """This node's address on the link (with its network), or AddressError in one line."""
    address = head_address(head)
    if iface not in addrs:
        known = ", ".join(sorted(addrs)) or "none"
        raise AddressError(f"CLUSTER_IFACE={iface!r}: no such interface here (have: {known})")
    mine = ipv4_interfaces(addrs, iface)
    if not mine:
        raise AddressError(
            f"CLUSTER_IFACE={iface!r} has no IPv4 address: give it one on the link "
            "(docs/CLUSTER.md, Cabling and addressing)"
        )
    shown = ", ".join(str(item) for item in mine)
    owner = owner_of(addrs, address)
    if rank == 0:
        for item in mine:
            if item.ip == address:
                return item
        where = f"it is on {owner}" if owner else "it is not an address of this host"
        raise AddressError(
            f"CLUSTER_HEAD_ADDR={head!r}: on the head it must be an address of "
            f"CLUSTER_IFACE={iface!r} ({shown}); {where}"
        )
    if owner is not None:
        raise AddressError(
            f"CLUSTER_HEAD_ADDR={head!r} is this host's own address (on {owner}): on the "
            "worker it must be the head's address"
        )
    for item in mine:
        if address in item.network:
            _not_network_or_broadcast(head, iface, address, item)
            return item
    raise AddressError(
        f"CLUSTER_HEAD_ADDR={head!r} is not in the network of CLUSTER_IFACE={iface!r} "
        f"({shown}): the pair's traffic would leave by another interface"
    )


def _not_network_or_broadcast(
    head: str, iface: str, address: IPv4Address, item: IPv4Interface
) -> None:
    """A /30 or wider network's first and last addresses name the network, not a host."""
    net = item.network
    if net.prefixlen <= 30 and address in (net.network_address, net.broadcast_address):
        which = "network" if address == net.network_address else "broadcast"
        raise AddressError(
            f"CLUSTER_HEAD_ADDR={head!r} is the {which} address of CLUSTER_IFACE={iface!r}'s "
            f"network {net}: it must be the head's own address"
        )
