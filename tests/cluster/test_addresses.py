"""The pair's address and interface rules (sparkserve.cluster.addresses): the head's address,
an interface's IPv4 addresses and owner, each node's address on the link, and whether
CLUSTER_IFACE is present, up and has a carrier, on hand-made hosts and on this machine's own
interfaces (`lo` and a name that does not exist)."""

from __future__ import annotations

import socket
from ipaddress import IPv4Address, IPv4Interface
from typing import NamedTuple

import psutil
import pytest

from sparkserve.cluster.addresses import (
    AddressError,
    head_address,
    interface_problem,
    ipv4_interfaces,
    link_address,
    owner_of,
)

MISSING = "sparkserve-no-such-if"  # longer than IFNAMSIZ allows, so no host has it


class Addr(NamedTuple):  # the fields of psutil's snicaddr that the rules read
    family: int
    address: str
    netmask: str | None


HOST = {
    "lo": [Addr(socket.AF_INET, "127.0.0.1", "255.0.0.0")],
    "eth0": [Addr(socket.AF_INET, "192.0.2.2", "255.255.255.0")],
    "cx7": [Addr(socket.AF_INET6, "fe80::1", None),
            Addr(socket.AF_INET, "169.254.10.1", "255.255.0.0")],
    "cx7b": [],
}  # fmt: skip

# One interface with two IPv4 networks: the rules pick the address that fits the head's.
TWO_NETS = {
    "cx7": [Addr(socket.AF_INET, "10.0.0.1", "255.255.255.0"),
            Addr(socket.AF_INET, "169.254.10.1", "255.255.0.0")],
}  # fmt: skip


def test_address_rules_on_a_hand_made_host() -> None:
    assert str(link_address(0, "169.254.10.1", "cx7", HOST)) == "169.254.10.1/16"
    assert str(link_address(1, "169.254.10.2", "cx7", HOST).ip) == "169.254.10.1"
    refused = {
        (0, "10.0.0.1", "nope"):
            "CLUSTER_IFACE='nope': no such interface here (have: cx7, cx7b, eth0, lo)",
        (0, "10.0.0.1", "cx7b"): "CLUSTER_IFACE='cx7b' has no IPv4 address",
        (0, "192.0.2.2", "cx7"): "(169.254.10.1/16); it is on eth0",
        (0, "169.254.10.9", "cx7"): "it is not an address of this host",
        (1, "169.254.10.1", "cx7"): "is this host's own address (on cx7)",
        (1, "10.1.1.1", "cx7"): "is not in the network of CLUSTER_IFACE='cx7'",
        (1, "224.0.0.1", "cx7"): "not unspecified, multicast or broadcast",
        (1, "300.1.1.1", "cx7"): "CLUSTER_HEAD_ADDR='300.1.1.1': must be an IPv4 address",
        (1, "", "cx7"): "CLUSTER_HEAD_ADDR is empty: required with CLUSTER_NODES=2",
    }  # fmt: skip
    for (rank, head, iface), needle in refused.items():
        with pytest.raises(AddressError) as caught:
            link_address(rank, head, iface, HOST)
        assert needle in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("169.254.10.1", "169.254.10.1"),  # link-local: NVIDIA's netplan for two Sparks
        ("127.0.0.1", "127.0.0.1"),  # loopback: both roles rehearsed on one machine
        (" 10.0.0.1\n", "10.0.0.1"),  # surrounding blanks are dropped
        ("0.0.0.1", "0.0.0.1"),  # next to the unspecified address
        ("223.255.255.255", "223.255.255.255"),  # next to the multicast block
        ("240.0.0.1", "240.0.0.1"),  # past the multicast block
        ("255.255.255.254", "255.255.255.254"),  # next to the broadcast address
    ],
)
def test_a_head_address_is_one_ipv4_address(text: str, parsed: str) -> None:
    assert head_address(text) == IPv4Address(parsed)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("  \t", "CLUSTER_HEAD_ADDR is empty: required with CLUSTER_NODES=2"),
        ("::1", "CLUSTER_HEAD_ADDR='::1': must be an IPv4 address"),
        ("10.0.0", "CLUSTER_HEAD_ADDR='10.0.0': must be an IPv4 address"),
        ("10.0.0.1/24", "CLUSTER_HEAD_ADDR='10.0.0.1/24': must be an IPv4 address"),
        ("head.local", "CLUSTER_HEAD_ADDR='head.local': must be an IPv4 address"),
        ("10.0.0.1\n10.0.0.2", "CLUSTER_HEAD_ADDR='10.0.0.1\\n10.0.0.2': must be an IPv4 address"),
        ("0.0.0.0", "CLUSTER_HEAD_ADDR='0.0.0.0': must be the head's address on the link, "
                    "not unspecified, multicast or broadcast"),
        ("224.0.0.0", "CLUSTER_HEAD_ADDR='224.0.0.0': must be the head's address"),
        ("239.255.255.255", "CLUSTER_HEAD_ADDR='239.255.255.255': must be the head's address"),
        ("255.255.255.255", "CLUSTER_HEAD_ADDR='255.255.255.255': must be the head's address"),
    ],
)  # fmt: skip
def test_a_bad_head_address_is_one_line_naming_it(text: str, message: str) -> None:
    with pytest.raises(AddressError) as caught:
        head_address(text)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_only_ipv4_addresses_with_a_netmask_count() -> None:
    assert ipv4_interfaces(HOST, "cx7") == [IPv4Interface("169.254.10.1/16")]
    assert ipv4_interfaces(TWO_NETS, "cx7") == [
        IPv4Interface("10.0.0.1/24"),
        IPv4Interface("169.254.10.1/16"),
    ]
    no_mask = {"cx7": [Addr(socket.AF_INET, "169.254.10.1", None)]}
    assert ipv4_interfaces(no_mask, "cx7") == []
    assert ipv4_interfaces(HOST, "cx7b") == []
    assert ipv4_interfaces(HOST, "nope") == []


def test_the_owner_of_an_address_is_the_interface_that_has_it() -> None:
    assert owner_of(HOST, IPv4Address("192.0.2.2")) == "eth0"
    assert owner_of(HOST, IPv4Address("169.254.10.1")) == "cx7"
    assert owner_of(HOST, IPv4Address("192.0.2.3")) is None  # in eth0's network, not its own
    assert owner_of({}, IPv4Address("127.0.0.1")) is None


def test_with_two_networks_on_the_interface_each_node_takes_the_fitting_one() -> None:
    assert link_address(0, "169.254.10.1", "cx7", TWO_NETS) == IPv4Interface("169.254.10.1/16")
    assert link_address(1, "10.0.0.2", "cx7", TWO_NETS) == IPv4Interface("10.0.0.1/24")
    assert link_address(1, "169.254.7.7", "cx7", TWO_NETS) == IPv4Interface("169.254.10.1/16")
    with pytest.raises(AddressError) as caught:
        link_address(0, "10.0.0.9", "cx7", TWO_NETS)
    assert str(caught.value) == (
        "CLUSTER_HEAD_ADDR='10.0.0.9': on the head it must be an address of "
        "CLUSTER_IFACE='cx7' (10.0.0.1/24, 169.254.10.1/16); it is not an address of this host"
    )


def test_a_host_without_interfaces_says_it_has_none() -> None:
    with pytest.raises(AddressError) as caught:
        link_address(0, "10.0.0.1", "cx7", {})
    assert str(caught.value) == "CLUSTER_IFACE='cx7': no such interface here (have: none)"
    assert interface_problem("cx7", {}) == (
        "CLUSTER_IFACE='cx7': no such interface here (have: none)"
    )


@pytest.mark.parametrize(
    ("head", "which", "network"),
    [
        ("169.254.255.255", "broadcast", "169.254.0.0/16"),
        ("169.254.0.0", "network", "169.254.0.0/16"),
        ("10.0.0.255", "broadcast", "10.0.0.0/24"),
    ],
)
def test_the_worker_refuses_its_networks_own_network_or_broadcast_address(
    head: str, which: str, network: str
) -> None:
    with pytest.raises(AddressError) as caught:
        link_address(1, head, "cx7", TWO_NETS)
    assert str(caught.value) == (
        f"CLUSTER_HEAD_ADDR={head!r} is the {which} address of CLUSTER_IFACE='cx7''s network "
        f"{network}: it must be the head's own address"
    )


def test_on_a_point_to_point_network_both_addresses_are_hosts() -> None:
    # a /31 has no network or broadcast address (RFC 3021): its two addresses are the pair's
    p2p = {"cx7": [Addr(socket.AF_INET, "10.9.0.1", "255.255.255.254")]}
    assert link_address(1, "10.9.0.0", "cx7", p2p) == IPv4Interface("10.9.0.1/31")


def test_the_head_address_is_checked_before_the_interface() -> None:
    with pytest.raises(AddressError) as caught:
        link_address(0, "0.0.0.0", "nope", HOST)
    assert str(caught.value).startswith("CLUSTER_HEAD_ADDR='0.0.0.0': ")


def test_both_roles_find_their_address_on_this_machines_loopback() -> None:
    addrs = psutil.net_if_addrs()
    assert IPv4Interface("127.0.0.1/8") in ipv4_interfaces(addrs, "lo")
    assert owner_of(addrs, IPv4Address("127.0.0.1")) == "lo"
    assert link_address(0, "127.0.0.1", "lo", addrs) == IPv4Interface("127.0.0.1/8")
    # 127.0.0.2 is in lo's network yet no interface's own address: the worker's head
    assert link_address(1, "127.0.0.2", "lo", addrs) == IPv4Interface("127.0.0.1/8")
    with pytest.raises(AddressError) as caught:
        link_address(1, "127.0.0.1", "lo", addrs)
    assert "is this host's own address (on lo)" in str(caught.value)


def test_loopback_up_with_a_carrier_has_no_problem() -> None:
    assert interface_problem("lo", psutil.net_if_stats()) is None


def test_a_missing_or_unset_interface_is_one_line() -> None:
    stats = psutil.net_if_stats()
    assert interface_problem(MISSING, stats) == (
        f"CLUSTER_IFACE={MISSING!r}: no such interface here (have: {', '.join(sorted(stats))})"
    )
    assert interface_problem("", stats) == (
        "CLUSTER_IFACE='': required with CLUSTER_NODES=2 (this machine's network interface "
        "on the link)"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("loopback", "CLUSTER_IFACE='lo': the interface is down (bring it up: ip link set lo up)"),
        ("loopback,running", "CLUSTER_IFACE='lo': the interface is down (bring it up: "
                             "ip link set lo up)"),
        ("up,loopback", "CLUSTER_IFACE='lo': the interface is up but has no link (no carrier: "
                        "check the cable and the other machine's port)"),
        ("", "CLUSTER_IFACE='lo': the interface is down (bring it up: ip link set lo up)"),
        ("up,running", None),
    ],
)  # fmt: skip
def test_the_interface_must_be_up_and_have_a_carrier(flags: str, message: str | None) -> None:
    # lo's own stats entry, with the flags a down or cable-less interface shows
    stats = psutil.net_if_stats()
    stats["lo"] = stats["lo"]._replace(flags=flags)
    assert interface_problem("lo", stats) == message
