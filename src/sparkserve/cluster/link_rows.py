"""`sparkserve doctor`'s rows about this node's end of the pair's link: the interface (there,
up, its speed and MTU), the addresses (cluster.addresses' rules) and the RDMA devices.

A Spark's ConnectX-7 port reports 200000 Mb/s when the cable is seated and the link trained:
NVIDIA's own link check (dgx-spark-playbooks, nvidia/connect-two-sparks/assets/
check-connectx-bandwidth) treats any other negotiated speed as a degraded link. The MTU is
reported, not judged: 9000 (jumbo frames) is what community two-Spark guides recommend for
RoCE, while NVIDIA's playbook leaves the default 1500; both ends must agree (the pair check
compares them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import IPv4Interface
from pathlib import Path
from typing import Any

import psutil

from sparkserve.cluster.addresses import AddressError, interface_problem, link_address
from sparkserve.cluster.check_row import Check, Status

SPARK_LINK_MBPS = 200_000
JUMBO_MTU = 9000
RDMA_DEVICES = Path("/dev/infiniband")


@dataclass(frozen=True)
class LinkEnd:
    """This node's end of the link, as the peer's doctor is told about it."""

    address: IPv4Interface
    speed_mbps: int  # 0: the driver does not say
    mtu: int


def interface_row(iface: str, stats: Mapping[str, Any], spark: bool) -> Check:
    problem = interface_problem(iface, stats)  # the launcher's own rule
    if problem:
        return Check("link", "blocker", problem)
    nic = stats[iface]
    speed = f"{nic.speed} Mb/s" if nic.speed else "speed not reported"
    status: Status = "ok"
    note = ""
    if nic.speed != SPARK_LINK_MBPS:
        status = "warn" if spark else "info"
        note = f"; a Spark's ConnectX-7 link shows {SPARK_LINK_MBPS} Mb/s"
    mtu = f"MTU {nic.mtu}" + ("" if nic.mtu >= JUMBO_MTU else f" ({JUMBO_MTU} often advised)")
    return Check("link", status, f"{iface} up, {speed}, {mtu}{note}")


def rdma_row(spark: bool, devices: Path = RDMA_DEVICES) -> Check:
    if devices.is_dir() and any(devices.iterdir()):
        found = ", ".join(sorted(path.name for path in devices.iterdir()))
        return Check("RDMA devices", "ok", f"{devices}: {found}")
    return Check(
        "RDMA devices",
        "blocker" if spark else "info",
        f"no {devices}: NCCL would fall back to TCP, and the cluster services pass it to "
        "the container (on a Spark the ConnectX-7 driver provides it)",
    )


def link_rows(values: Mapping[str, str], spark: bool) -> tuple[list[Check], LinkEnd | None]:
    """The rows, and this node's end of the link when the link and addresses are usable."""
    iface, head, rank = values["CLUSTER_IFACE"], values["CLUSTER_HEAD_ADDR"], values["CLUSTER_RANK"]
    stats = psutil.net_if_stats()
    rows = [interface_row(iface, stats, spark)]
    end = None
    if rows[0].status != "blocker":
        try:
            mine = link_address(int(rank), head, iface, psutil.net_if_addrs())
        except AddressError as error:
            rows.append(Check("link addresses", "blocker", str(error)))
        else:
            detail = f"{mine.ip} on {iface} ({mine.network}): " + (
                "the head's address"
                if rank == "0"
                else f"the worker's; the head {head} is in its network"
            )
            rows.append(Check("link addresses", "ok", detail))
            end = LinkEnd(mine, stats[iface].speed, stats[iface].mtu)
    rows.append(rdma_row(spark))
    return rows, end
