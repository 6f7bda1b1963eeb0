"""The benchmark itself: TTFT cold/warm, then decode cells (kind x concurrency), each between
two settled /metrics snapshots so the speculative and prefix-cache figures cover exactly it.

/metrics is server-wide: run the bench on a server nobody else is using.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkserve.client import metrics, prompts
from sparkserve.client.server import Server, ServerError, StreamResult
from sparkserve.client.tool import RunAborted


@dataclass(frozen=True)
class BenchConfig:
    kinds: tuple[str, ...]
    concurrency: tuple[int, ...]
    gen_tokens: int
    prefix_tokens: int
    ttft_rounds: int
    api: str = "chat"  # or "completions"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


class Bench:
    def __init__(
        self, server: Server, model: str, config: BenchConfig, say: Callable[[str], None] = print
    ) -> None:
        self.server = server
        self.model = model
        self.config = config
        self.say = say
        self.chars_per_token = 4.0

    def calibrate(self) -> None:
        """Characters per token of this model's tokenizer (for the prefix length), from
        /tokenize where the server has it; 4 otherwise. Sends no generation request."""
        sample = prompts.long_prefix(4000, "calibration")
        try:
            tokens = len(self.server.tokenize(self.model, sample))
        except ServerError:
            return
        if tokens > 0:
            self.chars_per_token = len(sample) / tokens

    def ttft(self) -> dict[str, Any]:
        """Per round: a new prefix (cold), then the same prefix with another question (warm)."""
        rounds = []
        chars = int(self.config.prefix_tokens * self.chars_per_token)
        for i in range(self.config.ttft_rounds):
            prefix = prompts.long_prefix(chars, uuid.uuid4().hex)
            row: dict[str, Any] = {}
            cold_text = f"{prefix}\n\nQuestion: summarise the document above in one sentence."
            # The warm prompt extends the cold one, as the next turn of a chat or an agent does:
            # a hybrid model's prefix cache (Mamba align mode) keeps its state at the end of
            # the cached prompt, so only a prompt that contains it whole can reuse it.
            warm_text = f"{cold_text}\nQuestion: name three places the document mentions."
            for label, text in (("cold", cold_text), ("warm", warm_text)):
                before = self.server.settled_metrics()
                result = self.server.stream_completion(self.model, text, 8, ignore_eos=True)
                if result.error:
                    raise RunAborted(f"TTFT {label}: {result.error}")
                after = self.server.settled_metrics()
                row[label] = {
                    "ttft_s": result.ttft_s,
                    "server_ttft_s": metrics.histogram_mean(
                        before, after, "vllm:time_to_first_token_seconds", self.model
                    ),
                    "prompt_tokens": result.prompt_tokens,
                    **metrics.prefix_hit_rate(before, after, self.model),
                }
            rounds.append(row)
            self.say(
                f"[bench] TTFT round {i + 1}/{self.config.ttft_rounds}: cold "
                f"{_fmt(row['cold']['ttft_s'])} s, warm {_fmt(row['warm']['ttft_s'])} s "
                f"({row['cold']['prompt_tokens']} prompt tokens)"
            )
        cold = [r["cold"]["ttft_s"] for r in rounds if r["cold"]["ttft_s"] is not None]
        warm = [r["warm"]["ttft_s"] for r in rounds if r["warm"]["ttft_s"] is not None]
        cold_m, warm_m = _median(cold), _median(warm)
        return {
            "prefix_tokens_requested": self.config.prefix_tokens,
            "rounds": rounds,
            "cold_ttft_s": cold_m,
            "warm_ttft_s": warm_m,
            "speedup": cold_m / warm_m if cold_m and warm_m else None,
        }

    def cell(self, kind: str, concurrency: int, index: int, total: int) -> dict[str, Any]:
        texts = [prompts.prompt(kind, v) for v in range(concurrency)]
        results: list[StreamResult | None] = [None] * concurrency
        send = (
            self.server.stream_chat if self.config.api == "chat" else self.server.stream_completion
        )

        def one(i: int) -> None:
            results[i] = send(self.model, texts[i], self.config.gen_tokens, ignore_eos=True)

        before = self.server.settled_metrics()
        started = time.monotonic()
        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.2)
        wall = time.monotonic() - started
        after = self.server.settled_metrics()
        done = [r for r in results if r is not None]
        failed = [r.error for r in done if r.error]
        if failed:
            raise RunAborted(f"{kind} at concurrency {concurrency}: {failed[0]}")
        per_stream = [r.decode_tok_s for r in done if r.decode_tok_s is not None]
        firsts = [r.first_token for r in done if r.first_token is not None]
        lasts = [r.last_token for r in done if r.last_token is not None]
        tokens = sum(r.completion_tokens for r in done)
        span = max(lasts) - min(firsts) if firsts and lasts else 0.0
        decode_tokens = sum(max(r.completion_tokens - 1, 0) for r in done)
        # Per stream: vLLM's own time per output token (the API process may merge tokens into
        # one chunk when it lags, which skews client timing); the client's figure otherwise.
        tpot = metrics.histogram_mean(
            before, after, "vllm:request_time_per_output_token_seconds", self.model
        )
        # All streams together: the client's span from the first token to the last; when each
        # stream reached the client in one chunk that span is 0, and the server's mean decode
        # time of these requests (they decode at once) stands in.
        decode_s = metrics.histogram_mean(
            before, after, "vllm:request_decode_time_seconds", self.model
        )
        if span > 0:
            aggregate, aggregate_source = decode_tokens / span, "client"
        elif decode_s:
            aggregate, aggregate_source = decode_tokens / decode_s, "server decode time"
        else:
            aggregate, aggregate_source = None, None
        row = {
            "kind": kind,
            "concurrency": concurrency,
            "wall_s": wall,
            "completion_tokens": tokens,
            "ttft_s_mean": _mean([r.ttft_s for r in done if r.ttft_s is not None]),
            "per_stream_tok_s": 1.0 / tpot if tpot else _mean(per_stream),
            "per_stream_source": "server TPOT" if tpot else "client",
            "aggregate_tok_s": aggregate,
            "aggregate_source": aggregate_source,
            "spec": metrics.acceptance(before, after, self.model),
            "client_per_stream_tok_s": _mean(per_stream),
            "server_tpot_s": tpot,
            "prefix": metrics.prefix_hit_rate(before, after, self.model),
            "_before": before,
            "_after": after,
        }
        # what a harness that counts streamed chunks as tokens would report (docs/PROOF-TOOLS.md)
        row["decode_steps_s_per_stream"] = metrics.steps_per_s(
            row["client_per_stream_tok_s"], row["spec"]
        )
        acc = row["spec"]["mean_acceptance_length"]
        self.say(
            f"[bench] {index}/{total} {kind} c={concurrency}: {_fmt(row['per_stream_tok_s'])} "
            f"tok/s per stream, {_fmt(row['aggregate_tok_s'])} aggregate, acceptance length "
            f"{_fmt(acc)}"
        )
        return row

    def run(self) -> dict[str, Any]:
        """Everything; `self.partial` holds what was measured if it breaks off."""
        self.partial: dict[str, Any] = {"ttft": None, "decode": []}
        start = self.server.settled_metrics()
        self.calibrate()
        if self.config.ttft_rounds > 0:
            self.partial["ttft"] = self.ttft()
        cells: list[dict[str, Any]] = []
        grid = [(k, c) for k in self.config.kinds for c in self.config.concurrency]
        for i, (kind, level) in enumerate(grid, 1):
            cells.append(self.cell(kind, level, i, len(grid)))
            self.partial["decode"] = [_public(c) for c in cells]
        end = self.server.settled_metrics()
        by_kind = {}
        for kind in self.config.kinds:
            rows = [c for c in cells if c["kind"] == kind]
            by_kind[kind] = metrics.acceptance(rows[0]["_before"], rows[-1]["_after"], self.model)
        return {
            "ttft": self.partial["ttft"],
            "decode": [_public(c) for c in cells],
            "acceptance_by_kind": by_kind,
            "overall": {
                "spec": metrics.acceptance(start, end, self.model),
                "prefix": metrics.prefix_hit_rate(start, end, self.model),
            },
        }


def _public(cell: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cell.items() if not k.startswith("_")}


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
