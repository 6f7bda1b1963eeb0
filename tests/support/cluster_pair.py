"""Run serve.sh as the two nodes of a pair, one in each network namespace (support.netns).

Each node gets what a machine of its own would have: its own network (the veth), its own
/dev/shm (a tmpfs mounted in the node's mount namespace, so that vLLM cannot take the two
"nodes" for one machine and pass tensors through shared memory) and its own state folder.
vLLM runs through its own CLI (`vllm serve`; a headless worker needs it), the CPU serving
venv's `vllm` command. Requests to the head's API are made inside the head's namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from support.cpu_launch import LAUNCHERS, NO_USAGE_REPORT, cpu_knobs, cpu_python
from support.netns import NodePair
from support.vllm_server import LOOPBACK, free_port, tail

SHM_SIZE = "1g"
KV_CACHE_BYTES = 64 * 1024 * 1024
TP_LINEAR_HEADS = 2  # GatedDeltaNet heads must divide by the tensor-parallel size


def tp_model(target: str, out: Path) -> Path:
    """The tiny target's geometry with two linear-attention heads (for TP=2), no weights:
    the pair loads it with LOAD_FORMAT=dummy."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(Path(target) / name, out / name)
    config = json.loads((Path(target) / "config.json").read_text())
    config.update(linear_num_key_heads=TP_LINEAR_HEADS, linear_num_value_heads=TP_LINEAR_HEADS)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


@dataclass
class Node:
    rank: int
    namespace: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    state_dir: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass
class Pair:
    net: NodePair
    head: Node
    worker: Node
    port: int
    started: float

    @property
    def nodes(self) -> tuple[Node, Node]:
        return self.head, self.worker

    def pids(self) -> list[int]:
        return [*self.net.pids(self.net.head), *self.net.pids(self.net.worker)]

    def logs(self) -> str:
        return "\n".join(f"--- node {n.rank} ---\n{tail(n.log_path, 40)}" for n in self.nodes)

    def request(self, body: Mapping[str, object], stream: bool = False,
                timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """POST a chat completion to the head's API, from inside the head's namespace."""
        return subprocess.run(self.client_argv(body, stream), capture_output=True, text=True,
                              timeout=timeout_s + 30)  # fmt: skip

    def client_argv(self, body: Mapping[str, object], stream: bool = False) -> list[str]:
        url = f"http://{LOOPBACK}:{self.port}/v1/chat/completions"
        payload = json.dumps({**body, "stream": stream})
        return self.net.exec_argv(self.net.head, [sys.executable, "-u", "-c", CLIENT, url, payload])

    def healthy(self) -> bool:
        """The head's /health answers 200 (asked from inside its namespace, by a process of
        its own: only once the log says the API is up, to spare 2 busy cores)."""
        if "Application startup complete" not in self.head.log():
            return False
        probe = self.net.run(self.net.head, sys.executable, "-c", HEALTH, str(self.port),
                             check=False)  # fmt: skip
        return probe.returncode == 0

    def wait_healthy(self, timeout_s: float) -> float:
        deadline = self.started + timeout_s
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc.poll() is not None:
                    raise AssertionError(f"node {node.rank} exited before the pair was healthy\n"
                                         f"{self.logs()}")  # fmt: skip
            if self.healthy():
                return time.monotonic() - self.started
            time.sleep(2.0)
        raise AssertionError(f"the pair is not healthy after {timeout_s:.0f} s\n{self.logs()}")

    def wait_gone(self, since: float, bound_s: float) -> float:
        """Seconds from `since` until no process is left in either namespace."""
        while self.pids() and time.monotonic() - since < bound_s:
            time.sleep(0.1)
        took = time.monotonic() - since
        if self.pids():
            left = self.describe_left()  # before the logs: it asks stuck watches for stacks
            raise AssertionError(f"processes left {took:.0f} s after the failure:\n{left}\n"
                                 f"{self.logs()}")  # fmt: skip
        for node in self.nodes:
            node.proc.wait(timeout=5)  # reap the launchers we started
        return took

    def describe_left(self) -> str:
        """One line per process left in either namespace; a pair watch among them writes its
        threads' stacks to its node's log (SIGUSR1)."""
        lines = []
        for namespace in (self.net.head, self.net.worker):
            for pid in self.net.pids(namespace):
                with contextlib.suppress(OSError):
                    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    wchan = Path(f"/proc/{pid}/wchan").read_text()
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                    lines.append(
                        f"{namespace} pid {pid} ppid {stat[1]} state {stat[0]} "
                        f"wchan {wchan or '-'}: {argv.decode(errors='replace')[:160]}"
                    )
                    if b"sparkserve.cluster.watch" in argv:
                        os.kill(pid, signal.SIGUSR1)
        time.sleep(1.0)
        return "\n".join(lines)

    def kill_node(self, namespace: str) -> None:
        """SIGKILL every process of a node (its watch, guard and vLLM): a machine gone."""
        for pid in self.net.pids(namespace):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            try:
                node.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()


# A client run inside the head's namespace: prints the body (or each streamed line as it
# comes); exit 1 with the error on an HTTP error or a broken connection.
CLIENT = """
import sys, urllib.request
url, body = sys.argv[1], sys.argv[2].encode()
request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=300) as answer:
        for line in answer:
            print(line.decode().rstrip(), flush=True)
except Exception as error:
    print(f"client error: {type(error).__name__}: {error}", flush=True)
    sys.exit(1)
"""
HEALTH = """
import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=5) as answer:
    sys.exit(0 if answer.status == 200 else 1)
"""


def node_env(
    net: NodePair, rank: int, layout: str, model: str, site: Path, work: Path, port: int,
    knobs: Mapping[str, str],
) -> dict[str, str]:  # fmt: skip
    folder = work / f"node{rank}"
    env = dict(os.environ, **cpu_knobs("dflash", {"target": model, "dflash": ""}, port, folder))
    env.update(
        MODEL=model, LOAD_FORMAT="dummy", NUM_SPEC_TOKENS="0", GPU_MEM="0.3",
        EXTRA_ARGS=f"--kv-cache-memory-bytes {KV_CACHE_BYTES}"
        + (" --enforce-eager" if layout == "tp" else ""),  # PP needs compiled mode (FACTS)
        CLUSTER_NODES="2", CLUSTER_RANK=str(rank), CLUSTER_LAYOUT=layout,
        CLUSTER_HEAD_ADDR=net.head_ip, CLUSTER_IFACE=net.head_if if rank == 0 else net.worker_if,
        SPARKSERVE_STATE_DIR=str(folder / "state"), VLLM_CPU_OMP_THREADS_BIND=str(rank),
        CLUSTER_SECRET="pair-e2e-secret-0123456789",  # the watch's joins and probes prove it
        VLLM_TARGET_DEVICE="cpu", PYTHONPATH=str(site), **NO_USAGE_REPORT,
        PATH=f"{Path(cpu_python()).parent}:{os.environ['PATH']}",
    )  # fmt: skip
    env.pop("VLLM_HOST_IP", None)  # the launcher sets it from the link
    env.update(knobs)
    return env


def start_node(net: NodePair, rank: int, env: Mapping[str, str], log_path: Path) -> Node:
    namespace = net.head if rank == 0 else net.worker
    # Inside `ip netns exec` (its own mount namespace): a private /dev/shm, then the launcher.
    argv = net.exec_argv(namespace, [
        "sh", "-c", f'mount -t tmpfs -o size={SHM_SIZE} sparkserve-shm /dev/shm && exec "$0"',
        str(LAUNCHERS["dflash"]),
    ])  # fmt: skip
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(env))  # fmt: skip
    return Node(rank, namespace, proc, log_path, Path(env["SPARKSERVE_STATE_DIR"]))


def start_pair(
    net: NodePair, layout: str, model: str, site: Path, work: Path,
    knobs: Mapping[str, str] | None = None,
) -> Pair:  # fmt: skip
    port = free_port()
    nodes = [
        start_node(
            net,
            rank,
            node_env(net, rank, layout, model, site, work, port, knobs or {}),
            work / f"node{rank}.log",
        )
        for rank in (0, 1)
    ]
    return Pair(net, nodes[0], nodes[1], port, time.monotonic())
