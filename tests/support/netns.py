"""Two network namespaces joined by a veth pair: two "nodes" of a pair on one machine.

Names carry this process's pid (`spn<pid>x<n>h` / `...w`), so that a later run removes what a
killed run left (`remove_stale`) without touching anyone else's namespaces. The addresses
come from a private /24 that no interface or route of this machine uses. Every process a test
starts in a namespace is found again by `ip netns pids` and killed when the pair is removed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import psutil
import pytest

PREFIX = "spn"
_NAME = re.compile(rf"^{PREFIX}(\d+)x(\d+)[hw]$")
_counter = itertools.count()


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"{PREFIX}{os.getpid()}x999h"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


def namespaces() -> list[str]:
    listed = ip("netns", "list", check=False).stdout.splitlines()
    return [line.split()[0] for line in listed if line.strip()]


def kill_all_in(name: str) -> None:
    for pid in ip("netns", "pids", name, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def remove(name: str) -> None:
    kill_all_in(name)
    ip("netns", "del", name, check=False)


def remove_stale() -> None:
    """Namespaces of ours whose creating process is gone (a killed test run)."""
    for name in namespaces():
        found = _NAME.match(name)
        if found and not psutil.pid_exists(int(found.group(1))):
            remove(name)


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine has an address in or a route to."""
    used = []
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family.name == "AF_INET" and address.netmask:
                used.append(ipaddress.IPv4Interface(f"{address.address}/{address.netmask}").network)
    routes = json.loads(ip("-4", "-j", "route", "show", "table", "all").stdout or "[]")
    for route in routes:
        with contextlib.suppress(ValueError):
            if route["dst"] != "default":
                used.append(ipaddress.IPv4Network(route["dst"], strict=False))
    return used


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.0.0.0/8 (RFC 1918) that overlaps nothing this machine uses."""
    used = used_networks()
    for third in range(200, 256):
        candidate = ipaddress.IPv4Network(f"10.{(os.getpid() % 200) + 20}.{third}.0/24")
        if not any(candidate.overlaps(network) for network in used):
            return candidate
    raise RuntimeError("no free private /24 found for the test namespaces")


@dataclass
class NodePair:
    """Namespaces `head` and `worker`, veths `head_if`/`worker_if` with the two addresses."""

    head: str
    worker: str
    head_if: str
    worker_if: str
    head_ip: str
    worker_ip: str
    subnet: ipaddress.IPv4Network
    made: list[str] = field(default_factory=list)

    # By side, 0 the head and 1 the worker, for tests that treat both nodes alike.
    @property
    def namespaces(self) -> tuple[str, str]:
        return (self.head, self.worker)

    @property
    def ifaces(self) -> tuple[str, str]:
        return (self.head_if, self.worker_if)

    @property
    def addresses(self) -> tuple[str, str]:
        return (self.head_ip, self.worker_ip)

    def argv(self, side: int, command: Sequence[str]) -> list[str]:
        """`command` run inside the namespace of `side`."""
        return self.exec_argv(self.namespaces[side], command)

    def set_mtu(self, side: int, mtu: int) -> None:
        self.run(self.namespaces[side], "ip", "link", "set", self.ifaces[side], "mtu", str(mtu))

    def set_link(self, side: int, up: bool) -> None:
        """Bring one side's veth up or down and wait until its carrier says so."""
        state = "up" if up else "down"
        self.run(self.namespaces[side], "ip", "link", "set", self.ifaces[side], state)
        self.wait_carrier(self.namespaces[side], self.ifaces[side], up=up)

    def exec_argv(self, namespace: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", namespace, *argv]

    def run(
        self, namespace: str, *argv: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.exec_argv(namespace, argv), check=check, capture_output=True,
                              text=True, timeout=60)  # fmt: skip

    def pids(self, namespace: str) -> list[int]:
        listed = ip("netns", "pids", namespace, check=False).stdout.split()
        return [int(pid) for pid in listed if psutil.pid_exists(int(pid))]

    def wait_carrier(
        self, namespace: str, interface: str, up: bool = True, timeout_s: float = 10.0
    ) -> None:
        """Until the veth reports LOWER_UP (or, `up` False, no longer does): a link that is up
        without a carrier is not RUNNING, and the launcher refuses it."""
        deadline = time.monotonic() + timeout_s
        while (
            "LOWER_UP" in self.run(namespace, "ip", "-br", "link", "show", interface).stdout
        ) != up:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{interface} in {namespace}: carrier not {up} after {timeout_s} s"
                )
            time.sleep(0.05)

    def cut(self, namespace: str) -> None:
        """Take the link down on one side (a pulled cable)."""
        interface = self.head_if if namespace == self.head else self.worker_if
        self.run(namespace, "ip", "link", "set", interface, "down")

    def remove(self) -> None:
        for name in self.made:
            remove(name)


@contextlib.contextmanager
def node_pair() -> Iterator[NodePair]:
    """Make the pair; remove it (and every process left in it) afterwards, even on failure."""
    remove_stale()
    n = next(_counter)
    subnet = free_subnet()
    hosts = list(subnet.hosts())
    pair = NodePair(
        head=f"{PREFIX}{os.getpid()}x{n}h", worker=f"{PREFIX}{os.getpid()}x{n}w",
        head_if=f"sph{os.getpid() % 100000}x{n}", worker_if=f"spw{os.getpid() % 100000}x{n}",
        head_ip=str(hosts[0]), worker_ip=str(hosts[1]), subnet=subnet,
    )  # fmt: skip
    try:
        for name in (pair.head, pair.worker):
            ip("netns", "add", name)
            pair.made.append(name)
        ip("link", "add", pair.head_if, "netns", pair.head, "type", "veth", "peer", "name",
           pair.worker_if, "netns", pair.worker)  # fmt: skip
        for name, interface, address in (
            (pair.head, pair.head_if, pair.head_ip),
            (pair.worker, pair.worker_if, pair.worker_ip),
        ):
            pair.run(name, "ip", "addr", "add", f"{address}/{subnet.prefixlen}", "dev", interface)
            pair.run(name, "ip", "link", "set", interface, "up")
            pair.run(name, "ip", "link", "set", "lo", "up")
        for name, interface in ((pair.head, pair.head_if), (pair.worker, pair.worker_if)):
            pair.wait_carrier(name, interface)
        yield pair
    finally:
        pair.remove()


@contextlib.contextmanager
def node_pair_or_skip() -> Iterator[NodePair]:
    """node_pair(), or the test skipped with the reason namespaces cannot be made here."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with node_pair() as made:
        yield made
