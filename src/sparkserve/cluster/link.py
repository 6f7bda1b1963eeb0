"""Check this machine's side of the pair's link before anything starts.

With CLUSTER_NODES=2 the head's address and this node's interface must describe one network
that exists here: the interface is present, up and has an IPv4 address; the head's address
lies in that interface's network; on the head it is the interface's own address, on the
worker it is not. Each failure is one KnobError line naming the knob, its value and what
was found, so that the launcher stops before loading anything.
"""

from __future__ import annotations

from collections.abc import Mapping

import psutil

from sparkserve.cluster.addresses import AddressError, interface_problem, link_address
from sparkserve.knobs.registry import KnobError


def host_ip(values: Mapping[str, str]) -> str:
    """This node's address on the link, after checking the link's knobs (KnobError). The
    address rules are cluster.addresses', which `sparkserve doctor` applies too."""
    iface = values["CLUSTER_IFACE"]
    problem = interface_problem(iface, psutil.net_if_stats())
    if problem is not None:
        raise KnobError(problem)
    rank = int(values["CLUSTER_RANK"])
    try:
        mine = link_address(rank, values["CLUSTER_HEAD_ADDR"], iface, psutil.net_if_addrs())
    except AddressError as error:
        raise KnobError(str(error)) from None
    return str(mine.ip)


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
    """What the launcher needs for the pair, after checking its knobs here: CLUSTER_HOST_IP
    (this node's address on the link, empty on one node)."""
    if values["CLUSTER_NODES"] != "2":
        return {"CLUSTER_HOST_IP": ""}
    address = host_ip(values)
    _ports(values)
    return {"CLUSTER_HOST_IP": address}
