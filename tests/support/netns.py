"""Two "nodes" on one machine: network namespaces joined by a veth pair (root only).

`veth_pair()` makes two namespaces, one veth end in each (up, with an address of a /24 that
no interface or route of this host uses, checked first), and removes everything when the
block ends, failed or not: processes still running inside are killed (by their pids, which
only the test's own commands can have), then the namespaces, which takes the veth with them.
Run every command that talks to those addresses inside a namespace (`Pair.argv`); nothing
reaches or leaves them from the host's own namespace.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

IP_TIMEOUT_S = 20


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=check
    )


def unavailable() -> str | None:
    """Why namespaces cannot be made here (a reason to skip), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    return None


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this host's interfaces and routes (all tables) use."""
    found = []
    for entry in json.loads(_ip("-j", "-4", "addr", "show").stdout or "[]"):
        for info in entry.get("addr_info", []):
            found.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", False))
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            found.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", False))
    return [net for net in found if isinstance(net, ipaddress.IPv4Network)]


def free_network() -> ipaddress.IPv4Network:
    """A /24 from 10.0.0.0/8 that overlaps nothing this host uses."""
    used = used_networks()
    for _ in range(200):
        candidate = ipaddress.IPv4Network(
            f"10.{secrets.randbelow(254) + 1}.{secrets.randbelow(256)}.0/24"
        )
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise RuntimeError("no free /24 in 10.0.0.0/8 for the test's namespaces")


@dataclass(frozen=True)
class Pair:
    namespaces: tuple[str, str]  # (head, worker)
    ifaces: tuple[str, str]  # each namespace's end of the veth
    addresses: tuple[str, str]
    network: ipaddress.IPv4Network

    def argv(self, side: int, command: Sequence[str]) -> list[str]:
        """`command` run inside namespace `side` (0 head, 1 worker)."""
        return ["ip", "netns", "exec", self.namespaces[side], *command]

    def set_mtu(self, side: int, mtu: int) -> None:
        _ip("-n", self.namespaces[side], "link", "set", self.ifaces[side], "mtu", str(mtu))

    def set_down(self, side: int) -> None:
        _ip("-n", self.namespaces[side], "link", "set", self.ifaces[side], "down")

    def set_up(self, side: int) -> None:
        _ip("-n", self.namespaces[side], "link", "set", self.ifaces[side], "up")


def _remove(names: Sequence[str], links: Sequence[str]) -> None:
    for name in names:
        pids = _ip("netns", "pids", name, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", name, check=False)
    for link in links:  # left in the host's namespace only when setup failed half-way
        if _ip("link", "show", link, check=False).returncode == 0:
            _ip("link", "del", link, check=False)


@contextlib.contextmanager
def veth_pair(tag: str = "ss") -> Iterator[Pair]:
    tag = f"{tag}{os.getpid() % 100000}{secrets.token_hex(2)}"
    names = (f"{tag}h", f"{tag}w")
    ifaces = (f"{tag}-h"[:15], f"{tag}-w"[:15])
    network = free_network()
    hosts = network.hosts()
    addresses = (str(next(hosts)), str(next(hosts)))
    try:
        for name in names:
            _ip("netns", "add", name)
        _ip("link", "add", ifaces[0], "type", "veth", "peer", "name", ifaces[1])
        for name, iface, address in zip(names, ifaces, addresses, strict=True):
            _ip("link", "set", iface, "netns", name)
            _ip("-n", name, "addr", "add", f"{address}/{network.prefixlen}", "dev", iface)
            _ip("-n", name, "link", "set", iface, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        yield Pair(names, ifaces, addresses, network)
    finally:
        _remove(names, ifaces)
