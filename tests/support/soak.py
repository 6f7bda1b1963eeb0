"""A bounded load and soak run against a real vLLM server: many clients, the memory of vLLM's
processes and of the memory guard sampled throughout, every request accounted for.

Each client sends streaming completions one after another (a distinct prompt each, greedy,
`ignore_eos`, a length drawn from `gen_tokens`) until the run's time is up; requests already
sent then finish. Every request ends in one of: `ok` (all its tokens), `http NNN` (a status
the server answered with), `over timeout` (not done `request_timeout_s` after it was sent: the
client gives up on it) or `broken: ...` (the connection failed or the stream ended early).

Memory is the RSS of the server's process tree below the launcher's shell (vLLM's API server, the
engine core, helpers), split into the memory guard with its keeper and the rest. RSS counts a page
shared by two processes twice; what is judged is its change over the run, not its size. Growth: the
median of the last fifth of the samples minus the median of the first fifth (the run starts after
one warm-up round, so allocator warm-up falls before the first fifth).

Used by tests/e2e/test_soak_server.py (short, behaviour only) and benchmarks/soak.py (long,
with the figures)."""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from sparkserve.client import metrics, prompts
from sparkserve.client.server import Server, StreamResult
from sparkserve.guard.monitor import metrics_dir
from sparkserve.guard.textfile import FILE_NAME

# the guard and its keeper, counted apart from vLLM
GUARD_MODULES = ("sparkserve.guard.monitor", "sparkserve.guard.keeper")
API_SERVER_WORD = "serve"  # the launcher's child `vllm serve ...`: vLLM's API server
MIB = 1024 * 1024


@dataclass(frozen=True)
class SoakPlan:
    clients: int
    duration_s: float
    request_timeout_s: float
    gen_tokens: tuple[int, int] = (16, 48)  # each request's length: uniform in this range
    sample_s: float = 1.0
    seed: int = 2026


@dataclass
class MemorySample:
    t: float  # seconds since the load started
    vllm_rss_mib: float  # every process of the tree but the launcher's shell and the guard
    guard_rss_mib: float | None  # None: no guard process found
    vllm_processes: int
    in_flight: int
    api_rss_mib: float = 0.0  # vLLM's API server (the launcher's `vllm serve` child)
    engine_rss_mib: float = 0.0  # the engine core process(es)
    worker_rss_mib: float = 0.0  # the engine core's model worker(s): weights, KV pool


@dataclass
class RequestRecord:
    client: int
    sent_t: float
    gen_tokens: int
    outcome: str
    wall_s: float
    ttft_s: float | None
    completion_tokens: int


@dataclass
class SoakResult:
    plan: SoakPlan
    load_s: float  # from the first request sent to the last one ended
    requests: list[RequestRecord] = field(default_factory=list)
    samples: list[MemorySample] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "plan": asdict(self.plan),
            "load_s": self.load_s,
            "summary": summary(self),
            "requests": [asdict(r) for r in self.requests],
            "samples": [asdict(s) for s in self.samples],
        }


@dataclass
class TreeMemory:
    vllm_mib: float = 0.0  # the tree of the launcher's PID without the guard
    guard_mib: float | None = None  # None: no guard process found
    processes: int = 0  # counted in vllm_mib
    api_mib: float = 0.0
    engine_mib: float = 0.0
    worker_mib: float = 0.0


def tree_memory(pid: int) -> TreeMemory:
    """The RSS of the tree of `pid` (vLLM's processes, the guard apart)."""
    seen = TreeMemory()
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return seen
    for proc in procs:
        try:
            rss = proc.memory_info().rss / MIB
            words = proc.cmdline()
            is_guard = any(module in words for module in GUARD_MODULES)
            name = proc.name()  # VLLM::EngineCore, VLLM::Worker (the kernel keeps 15 chars)
            is_api = proc.ppid() == pid and API_SERVER_WORD in words[:3]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if is_guard:
            seen.guard_mib = (seen.guard_mib or 0.0) + rss
            continue
        if proc.pid == pid:
            continue  # the launcher's shell, which waits on vLLM
        seen.vllm_mib += rss
        seen.processes += 1
        if is_api:
            seen.api_mib = rss
        elif "EngineCor" in name:
            seen.engine_mib += rss
        elif "Worker" in name:
            seen.worker_mib += rss
    return seen


def guard_state(hf_home: str | Path) -> dict[str, Any]:
    """What the guard's textfile says: watching (1/0/None) and the reason it tripped, if any."""
    path = metrics_dir(hf_home) / FILE_NAME
    try:
        snap = metrics.parse(path.read_text())
    except OSError:
        return {"file": str(path), "watching": None, "tripped": None}
    tripped = [
        dict(pairs).get("reason")
        for (name, pairs), value in snap.items()
        if name == "sparkserve_guard_tripped" and value == 1
    ]
    watching = metrics.total(snap, "sparkserve_guard_watching")
    return {"file": str(path), "watching": watching, "tripped": tripped[0] if tripped else None}


def outcome_of(result: StreamResult, wanted: int, timed_out: bool) -> str:
    if timed_out:
        return "over timeout"
    if result.error is None:
        if result.completion_tokens == wanted:
            return "ok"
        return f"broken: {result.completion_tokens} of {wanted} tokens"
    if result.error.startswith("HTTP "):
        return "http " + result.error.split()[1].rstrip(":")
    return f"broken: {result.error}"


def run_soak(server: Server, model: str, server_pid: int, plan: SoakPlan) -> SoakResult:
    """The run of the module docstring; returns when every request has ended."""
    rng = random.Random(plan.seed)
    warm = [server.stream_completion(model, prompts.prompt("prose", v), 8) for v in range(2)]
    if any(r.error for r in warm):
        raise RuntimeError(f"warm-up request failed: {next(r.error for r in warm if r.error)}")
    records: list[RequestRecord] = []
    lock = threading.Lock()
    in_flight = [0]
    started = time.monotonic()
    end_of_sending = started + plan.duration_s
    lengths = [rng.randint(*plan.gen_tokens) for _ in range(100_000)]
    counter = iter(range(len(lengths)))

    def client(index: int) -> None:
        while time.monotonic() < end_of_sending:
            with lock:
                number = next(counter)
                in_flight[0] += 1
            wanted = lengths[number]
            kind = prompts.KINDS[number % len(prompts.KINDS)]
            sent = time.monotonic()
            deadline = sent + plan.request_timeout_s
            result = server.stream_completion(
                model, prompts.prompt(kind, number), wanted,
                should_stop=lambda d=deadline: time.monotonic() > d,
            )  # fmt: skip
            ended = result.ended or time.monotonic()
            timed_out = result.error == "stopped" or ended > deadline
            record = RequestRecord(
                client=index, sent_t=round(sent - started, 3), gen_tokens=wanted,
                outcome=outcome_of(result, wanted, timed_out), wall_s=round(ended - sent, 3),
                ttft_s=None if result.ttft_s is None else round(result.ttft_s, 4),
                completion_tokens=result.completion_tokens,
            )  # fmt: skip
            with lock:
                records.append(record)
                in_flight[0] -= 1

    samples: list[MemorySample] = []
    done = threading.Event()

    def sampler() -> None:
        while True:
            seen = tree_memory(server_pid)
            samples.append(
                MemorySample(
                    t=round(time.monotonic() - started, 3), vllm_rss_mib=round(seen.vllm_mib, 1),
                    guard_rss_mib=None if seen.guard_mib is None else round(seen.guard_mib, 1),
                    vllm_processes=seen.processes, in_flight=in_flight[0],
                    api_rss_mib=round(seen.api_mib, 1), engine_rss_mib=round(seen.engine_mib, 1),
                    worker_rss_mib=round(seen.worker_mib, 1),
                )
            )  # fmt: skip
            if done.wait(plan.sample_s):
                return

    watcher = threading.Thread(target=sampler, daemon=True, name="soak-memory")
    watcher.start()
    threads = [
        threading.Thread(target=client, args=(i,), daemon=True, name=f"soak-client-{i}")
        for i in range(plan.clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=plan.duration_s + plan.request_timeout_s + 60)
    load_s = time.monotonic() - started
    done.set()
    watcher.join(timeout=10)
    return SoakResult(plan, round(load_s, 3), sorted(records, key=lambda r: r.sent_t), samples)


def percentile(values: Sequence[float], pct: float) -> float | None:
    """The nearest-rank percentile (no interpolation); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(pct / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def growth(values: Sequence[float]) -> dict[str, float | None]:
    """Median of the last fifth minus median of the first fifth (module docstring)."""
    if len(values) < 5:
        return {"first_mib": None, "last_mib": None, "growth_mib": None, "growth_pct": None}
    fifth = len(values) // 5
    first = statistics.median(values[:fifth])
    last = statistics.median(values[-fifth:])
    return {
        "first_mib": round(first, 1),
        "last_mib": round(last, 1),
        "growth_mib": round(last - first, 1),
        "growth_pct": round(100 * (last - first) / first, 2) if first else None,
    }


def stats(requests: Sequence[RequestRecord], seconds: float) -> dict[str, Any]:
    """Counts by outcome, p50/p99 TTFT and latency of the `ok` ones, tokens per second."""
    ok = [r for r in requests if r.outcome == "ok"]
    outcomes: dict[str, int] = {}
    for r in requests:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    wall = [r.wall_s for r in ok]
    tokens = sum(r.completion_tokens for r in requests)

    def rounded(x: float | None, digits: int = 3) -> float | None:
        return None if x is None else round(x, digits)

    return {
        "requests": len(requests),
        "outcomes": outcomes,
        "ttft_p50_s": rounded(percentile(ttft, 50)),
        "ttft_p99_s": rounded(percentile(ttft, 99)),
        "latency_p50_s": rounded(percentile(wall, 50)),
        "latency_p99_s": rounded(percentile(wall, 99)),
        "latency_max_s": rounded(max((r.wall_s for r in requests), default=None)),
        "completion_tokens": tokens,
        "tokens_per_s": rounded(tokens / seconds if seconds > 0 else None, 1),
    }


def summary(result: SoakResult) -> dict[str, Any]:
    vllm = [s.vllm_rss_mib for s in result.samples if s.vllm_processes]
    guard = [s.guard_rss_mib for s in result.samples if s.guard_rss_mib is not None]
    return {
        **stats(result.requests, result.load_s),
        "memory_samples": len(result.samples),
        "vllm_rss": growth(vllm) | {"peak_mib": max(vllm, default=None)},
        "api_server_rss": growth([s.api_rss_mib for s in result.samples if s.vllm_processes]),
        "engine_core_rss": growth([s.engine_rss_mib for s in result.samples if s.vllm_processes]),
        "worker_rss": growth([s.worker_rss_mib for s in result.samples if s.vllm_processes]),
        "guard_rss": growth(guard) | {"peak_mib": max(guard, default=None)},
        "guard_seen_in_every_sample": bool(result.samples)
        and all(s.guard_rss_mib is not None for s in result.samples),
    }


def windows(result: SoakResult, seconds: float) -> list[dict[str, Any]]:
    """Per window of `seconds` (by the time each request was sent): its request stats and the
    memory sampled in it, for the benchmark's table."""
    rows: list[dict[str, Any]] = []
    count = max(1, int(result.plan.duration_s // seconds + (result.plan.duration_s % seconds > 0)))
    for i in range(count):
        lo, hi = i * seconds, (i + 1) * seconds
        inside = [r for r in result.requests if lo <= r.sent_t < hi]
        mem = [s for s in result.samples if lo <= s.t < hi]
        vllm = [s.vllm_rss_mib for s in mem if s.vllm_processes]
        guard = [s.guard_rss_mib for s in mem if s.guard_rss_mib is not None]
        span = min(hi, result.load_s) - lo
        rows.append(
            {"window": f"{lo:.0f}-{hi:.0f} s"}
            | _table_stats(stats(inside, span))
            | {
                "vllm_rss_mib": round(statistics.median(vllm), 1) if vllm else None,
                "guard_rss_mib": round(statistics.median(guard), 1) if guard else None,
            }
        )
    return rows


def _table_stats(row: Mapping[str, Any]) -> dict[str, Any]:
    outcomes = row["outcomes"]
    return {
        "requests": row["requests"],
        "ok": outcomes.get("ok", 0),
        "other": sum(v for k, v in outcomes.items() if k != "ok"),
        "ttft_p50_s": row["ttft_p50_s"],
        "ttft_p99_s": row["ttft_p99_s"],
        "latency_p50_s": row["latency_p50_s"],
        "latency_p99_s": row["latency_p99_s"],
        "tokens_per_s": row["tokens_per_s"],
    }
