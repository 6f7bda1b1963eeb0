"""Replicas for the router tests: vLLM CPU servers through serve.sh over the tiny plain target
(the cheapest to serve) with API_KEY, as the `sparkserve` service runs them, and vLLM's render
routes on (--enable-scale-out: cache_aware asks each replica for the prompt's token ids there;
vLLM answers 403 without it, docs/CLUSTER.md). Started together, each waited for, stopped
together."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from support.cpu_launch import EAGER, KV_CACHE_BYTES, launcher_server
from support.vllm_server import VllmServer

REPLICA_KEY = "router-test-key-1"
# The modules that share two replicas (tests/router/conftest.py, `router_replicas`): one group
# of tests/conftest.py's, so one process runs them one after the other.
ROUTER_REPLICA_MODULES = (
    "tests/router/test_consistent_hash.py",
    "tests/router/test_fleet.py",
    "tests/router/test_fleet_watch.py",
    "tests/router/test_router_replicas.py",
)


def replica(
    work: Path, models: Mapping[str, str], site: Path, knobs: Mapping[str, str] | None = None
) -> VllmServer:
    """One replica (not started); `knobs` over the replicas' own."""
    own = {
        "MODEL": models["plain"],
        "API_KEY": REPLICA_KEY,
        "NUM_SPEC_TOKENS": "0",
        "SHUTDOWN_TIMEOUT_S": "5",
        "EXTRA_ARGS": f"--kv-cache-memory-bytes {KV_CACHE_BYTES} {EAGER} --enable-scale-out",
    }
    return launcher_server(work, "dflash", models, site, {**own, **(knobs or {})})


class Replicas:
    """Servers started together (their starts overlap) and stopped together; `get()` starts
    any that is not running (never started, stopped, or exited) and waits until each is
    healthy."""

    def __init__(self, servers: Sequence[VllmServer]) -> None:
        self.servers = list(servers)

    def start(self) -> None:
        """Start those not running, without waiting for them."""
        for server in self.servers:
            if server.proc is None or server.proc.poll() is not None:
                server.stop()  # its log closed, leftovers of its group ended
                server.start()

    def get(self) -> list[VllmServer]:
        try:
            self.start()
            for server in self.servers:
                server.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self.servers

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
