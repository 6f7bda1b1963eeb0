"""Prometheus text from vLLM's /metrics, and what the tools derive from counter deltas.

Pure functions: no I/O. A snapshot is {(name, sorted label pairs): value}.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MetricKey = tuple[str, tuple[tuple[str, str], ...]]
Snapshot = dict[MetricKey, float]

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# drafts that had a token at each position (sparkserve.in_vllm.spec_metrics, sparkserve's vLLM
# plugin)
DRAFTS_PER_POS = "sparkserve_spec_decode_num_drafts_per_pos_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
CACHE_INFO = "vllm:cache_config_info"

_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> Snapshot:
    """Prometheus text exposition format -> {(name, sorted labels): value}."""
    out: Snapshot = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        try:
            out[(name, tuple(sorted(_LABEL.findall(labels or ""))))] = float(value)
        except ValueError:
            continue
    return out


def _matches(pairs: tuple[tuple[str, str], ...], model: str | None) -> bool:
    if model is None:
        return True
    names = dict(pairs).get("model_name")
    return names is None or names == model


def has(snapshot: Mapping[MetricKey, float], name: str) -> bool:
    return any(n == name for n, _ in snapshot)


def total(snapshot: Mapping[MetricKey, float], name: str, model: str | None = None) -> float:
    """Sum of the samples called `name` (over engines), limited to `model` when labelled."""
    return sum(v for (n, p), v in snapshot.items() if n == name and _matches(p, model))


def by_label(
    snapshot: Mapping[MetricKey, float], name: str, label: str, model: str | None = None
) -> dict[str, float]:
    """{label value: summed sample} for the samples called `name`."""
    out: dict[str, float] = {}
    for (n, pairs), value in snapshot.items():
        if n != name or not _matches(pairs, model):
            continue
        key = dict(pairs).get(label)
        if key is not None:
            out[key] = out.get(key, 0.0) + value
    return out


def delta(
    before: Mapping[MetricKey, float],
    after: Mapping[MetricKey, float],
    name: str,
    model: str | None = None,
) -> float | None:
    """How much counter `name` grew between two snapshots; None when the server lacks it."""
    if not has(after, name):
        return None
    return total(after, name, model) - total(before, name, model)


def acceptance(
    before: Mapping[MetricKey, float], after: Mapping[MetricKey, float], model: str | None = None
) -> dict[str, object]:
    """Speculative decoding over a window: mean acceptance length (1 + accepted / drafts) and
    the acceptance rate per draft position: accepted at the position / the drafts that reached
    it (DRAFTS_PER_POS; None where none did: not proposed is not rejected), or / every draft
    from a vLLM without sparkserve's plugin (`acceptance_per_position_of` says which). Values
    are None ("n/a") when the server has no speculative counters or drafted nothing."""
    drafts = delta(before, after, DRAFTS, model)
    accepted = delta(before, after, ACCEPTED, model)
    draft_tokens = delta(before, after, DRAFT_TOKENS, model)
    mean_len: float | None = None
    per_pos: list[float | None] | None = None
    reached_after = by_label(after, DRAFTS_PER_POS, "position", model)
    reached_before = by_label(before, DRAFTS_PER_POS, "position", model)
    if drafts and accepted is not None:
        mean_len = 1.0 + accepted / drafts
        pos_after = by_label(after, ACCEPTED_PER_POS, "position", model)
        pos_before = by_label(before, ACCEPTED_PER_POS, "position", model)
        order = sorted(pos_after, key=lambda p: int(p) if p.isdigit() else p)
        per_pos = [
            per_position(
                pos_after[p] - pos_before.get(p, 0.0),
                reached_after.get(p, 0.0) - reached_before.get(p, 0.0) if reached_after else drafts,
            )
            for p in order
        ] or None
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted": accepted,
        "mean_acceptance_length": mean_len,
        "acceptance_per_position": per_pos,
        "acceptance_per_position_of": "drafts that reached it" if reached_after else "all drafts",
    }


def steps_per_s(tokens_per_s: float | None, spec: Mapping[str, object]) -> float | None:
    """Decode steps (the target's forward passes) per second behind `tokens_per_s`: each step
    emits one token plus the drafts it accepted, so tokens/s / the mean accepted length of
    `spec` (an `acceptance` window); tokens/s itself where nothing was drafted (a step is a
    token). None where either is unknown."""
    length = spec.get("mean_acceptance_length")
    if tokens_per_s is None:
        return None
    if isinstance(length, float | int) and length > 0:
        return tokens_per_s / float(length)
    return None if spec.get("drafts") else tokens_per_s


def per_position(accepted: float, reached: float) -> float | None:
    return accepted / reached if reached else None


def histogram_mean(
    before: Mapping[MetricKey, float],
    after: Mapping[MetricKey, float],
    name: str,
    model: str | None = None,
) -> float | None:
    """Mean of the observations a histogram `name` got between two snapshots (from its _sum
    and _count); None when absent or nothing was observed."""
    count = delta(before, after, f"{name}_count", model)
    total_ = delta(before, after, f"{name}_sum", model)
    if not count or total_ is None:
        return None
    return total_ / count


def prefix_hit_rate(
    before: Mapping[MetricKey, float], after: Mapping[MetricKey, float], model: str | None = None
) -> dict[str, float | None]:
    """Prefix-cache hits / queries (in tokens) over a window; None where not available."""
    queries = delta(before, after, PREFIX_QUERIES, model)
    hits = delta(before, after, PREFIX_HITS, model)
    rate = hits / queries if queries and hits is not None else None
    return {"queries": queries, "hits": hits, "hit_rate": rate}


def cache_pool_tokens(snapshot: Mapping[MetricKey, float]) -> int | None:
    """The KV pool in tokens from vllm:cache_config_info: its kv_cache_size_tokens label
    (the figure the log prints; on a hybrid model smaller than blocks x block size, since
    the Mamba groups share the blocks), else num_gpu_blocks x block_size."""
    for (name, pairs), _ in snapshot.items():
        if name != CACHE_INFO:
            continue
        labels = dict(pairs)
        try:
            return int(float(labels["kv_cache_size_tokens"]))
        except (KeyError, ValueError):
            pass
        try:
            blocks = int(float(labels["num_gpu_blocks"]))
            block = int(float(labels["block_size"]))
        except (KeyError, ValueError):
            continue
        if blocks > 0 and block > 0:
            return blocks * block
    return None


_LOG_POOL = re.compile(r"(?:GPU|CPU) KV cache size:\s*([\d,]+)\s*tokens")


def pool_tokens_from_log(text: str) -> int | None:
    """The last `GPU KV cache size: N tokens` figure a vLLM log printed (CPU builds: `CPU`)."""
    found = _LOG_POOL.findall(text)
    return int(found[-1].replace(",", "")) if found else None
