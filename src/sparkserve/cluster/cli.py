"""`sparkserve cluster watch|health`: the pair's watch (cluster.watch) and its health check."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from sparkserve.cluster import health, watch


def _run_health(args: argparse.Namespace) -> int:
    return health.run(args.state_file or watch.state_path(os.environ), "sparkserve cluster health")


def add_command(commands: Any) -> None:
    parser = commands.add_parser("cluster", help="a pair of nodes: the watch and its health")
    actions = parser.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    watcher = actions.add_parser("watch", help="watch the peer; a failure stops both nodes")
    watch.configure(watcher)
    watcher.set_defaults(run=watch.run)
    checker = actions.add_parser(
        "health", help="exit 0 when the pair is joined and the peer alive (compose healthcheck)"
    )
    checker.add_argument(
        "--state-file",
        type=Path,
        default=None,
        help="the watch's state file (default: the launcher's)",
    )
    checker.set_defaults(run=_run_health)
