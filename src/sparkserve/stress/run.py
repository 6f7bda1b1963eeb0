"""One stress run: the phases of the bank one after another, memory sampled throughout.

Each phase sends its level's requests at once (streaming, greedy, ignore_eos so they generate
the full length) and waits for all of them. Prompts are token ids, each with its own header,
so no two share a cached prefix block and every request takes its own share of the pool.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkserve.client import metrics
from sparkserve.client.bank import Phase
from sparkserve.client.server import Server, ServerError, StreamResult
from sparkserve.client.tool import RunAborted
from sparkserve.stress.sampler import MemorySampler, Sample

SEED_TEXT = (
    "The DGX Spark shares one pool of memory between its CPU and its GPU, so every gigabyte "
    "the model server reserves for weights and for the key-value cache is a gigabyte the "
    "operating system no longer has. A long conversation grows the cache block by block; "
    "when many long conversations run at once the pool fills, and what happens then decides "
    "whether the machine stays responsive or starts to swap. "
)


@dataclass
class PhaseRecord:
    phase: Phase
    start_t: float | None = None
    end_t: float | None = None
    results: list[StreamResult] = field(default_factory=list)

    def as_dict(self, samples: list[Sample], t0: float) -> dict[str, Any]:
        inside = [
            s
            for s in samples
            if self.start_t is not None and self.start_t <= s.t <= (self.end_t or s.t)
        ]
        kv = [s.kv_usage for s in inside if s.kv_usage is not None]
        return {
            "name": self.phase.name,
            "concurrency": self.phase.concurrency,
            "prompt_tokens": self.phase.prompt_tokens,
            "gen_tokens": self.phase.gen_tokens,
            "start_t": self.start_t,
            "end_t": self.end_t,
            "complete": self.end_t is not None
            and len(self.results) == self.phase.concurrency
            and all(r.error is None for r in self.results),
            "min_available_gib": min((s.mem_available_gib for s in inside), default=None),
            "peak_kv_usage": max(kv, default=None),
            "requests": [_request(r, t0) for r in self.results],
        }


def _request(r: StreamResult, t0: float) -> dict[str, Any]:
    def rel(x: float | None) -> float | None:
        return None if x is None else round(x - t0, 3)

    return {
        "start_t": rel(r.started),
        "first_token_t": rel(r.first_token),
        "end_t": rel(r.ended),
        "ttft_s": r.ttft_s,
        "decode_tok_s": r.decode_tok_s,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "error": r.error,
    }


class StressRun:
    def __init__(
        self,
        server: Server,
        model: str,
        phases: list[Phase],
        sampler: MemorySampler,
        *,
        settle_s: float = 2.0,
        progress_s: float = 5.0,
        say: Callable[[str], None] = print,
    ) -> None:
        self.server = server
        self.model = model
        self.records = [PhaseRecord(p) for p in phases]
        self.sampler = sampler
        self.settle_s = settle_s
        self.progress_s = progress_s
        self.say = say
        self._stop = threading.Event()
        self._seed: list[int] = []
        self._headers: dict[str, list[int]] = {}

    def prepare(self) -> None:
        """Tokenize before any load (a failure here is a preflight error)."""
        self._seed = self.server.tokenize(self.model, SEED_TEXT)
        if not self._seed:
            raise ServerError("/tokenize returned no tokens for the seed text")
        for record in self.records:
            for i in range(record.phase.concurrency):
                key = f"{record.phase.name}#{i}"
                header = f"Stress request {key} at {time.time_ns()}. "
                self._headers[key] = self.server.tokenize(self.model, header)

    def prompt(self, phase: Phase, index: int) -> list[int]:
        header = self._headers[f"{phase.name}#{index}"][: phase.prompt_tokens]
        body = [self._seed[i % len(self._seed)] for i in range(phase.prompt_tokens - len(header))]
        return header + body

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Run every phase; raises RunAborted (after recording) when a request fails."""
        self.sampler.phase("idle")
        self._stop.wait(self.settle_s)
        for record in self.records:
            if self._stop.is_set():
                return
            self._run_phase(record)
            self.sampler.phase("idle")
            # The request that failed first, not the ones this run then stopped.
            failed = sorted(
                (r.error for r in record.results if r.error), key=lambda e: e == "stopped"
            )
            if failed:
                raise RunAborted(
                    f"{len(failed)} of {record.phase.concurrency} requests failed during "
                    f"{record.phase.name}: {failed[0]}"
                )
            self._stop.wait(self.settle_s)

    def _run_phase(self, record: PhaseRecord) -> None:
        phase = record.phase
        self.say(
            f"[stress] {phase.name}: {phase.concurrency} request(s) of {phase.prompt_tokens} "
            f"prompt + {phase.gen_tokens} generated tokens"
        )
        prompts = [self.prompt(phase, i) for i in range(phase.concurrency)]
        slots: list[StreamResult | None] = [None] * phase.concurrency
        live: list[StreamResult] = []
        lock = threading.Lock()

        def on_chunk(result: StreamResult) -> None:
            with lock:
                if result not in live:
                    live.append(result)

        def one(i: int) -> None:
            result = self.server.stream_completion(
                self.model,
                prompts[i],
                phase.gen_tokens,
                on_chunk=on_chunk,
                should_stop=self._stop.is_set,
            )
            if result.error is None and result.completion_tokens < phase.gen_tokens:
                result.error = (
                    f"ended after {result.completion_tokens} of {phase.gen_tokens} tokens "
                    f"(finish_reason {result.finish_reason})"
                )
            slots[i] = result
            if result.error:
                self._stop.set()  # the rest of the phase stops at its next chunk

        self.sampler.phase(phase.name)
        record.start_t = self.sampler.now()
        threads = [
            threading.Thread(target=one, args=(i,), daemon=True, name=f"{phase.name}#{i}")
            for i in range(phase.concurrency)
        ]
        for thread in threads:
            thread.start()
        next_report = time.monotonic() + self.progress_s
        try:
            while alive := [t for t in threads if t.is_alive()]:
                alive[0].join(timeout=0.2)
                if time.monotonic() >= next_report:
                    next_report += self.progress_s
                    self._progress(phase, slots, live)
        finally:
            record.end_t = self.sampler.now()
            record.results = [s for s in slots if s is not None]
        self._progress(phase, slots, live, final=True)

    def _progress(
        self,
        phase: Phase,
        slots: list[StreamResult | None],
        live: list[StreamResult],
        final: bool = False,
    ) -> None:
        samples = self.sampler.snapshot()
        done = sum(1 for s in slots if s is not None)
        chunks = sum(r.chunks for r in live)
        mem = ""
        if samples:
            last = samples[-1]
            low = min(s.mem_available_gib for s in samples)
            mem = (
                f", MemAvailable {last.mem_available_gib:.2f} GiB (low {low:.2f}), swap "
                f"{last.swap_used_gib * 1024:.0f} MiB"
            )
            if last.kv_usage is not None:
                mem += f", KV pool {last.kv_usage * 100:.0f}%"
        state = "done" if final else "running"
        self.say(
            f"[stress] {phase.name} {state} at {self.sampler.now():.1f} s: {done}/"
            f"{phase.concurrency} finished, {chunks} chunks streamed{mem}"
        )


def kv_probe(server: Server, model: str) -> Callable[[], float | None]:
    def probe() -> float | None:
        snap = server.metrics()
        if not metrics.has(snap, metrics.KV_USAGE):
            return None
        values = metrics.by_label(snap, metrics.KV_USAGE, "model_name")
        if values:
            return values.get(model, max(values.values()))
        return metrics.total(snap, metrics.KV_USAGE)

    return probe
