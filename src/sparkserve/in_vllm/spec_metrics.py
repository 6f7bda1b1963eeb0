"""vLLM general plugin: count, per draft position, the drafts that reached that position.

vLLM exports the accepted tokens per draft position (`vllm:spec_decode_num_accepted_tokens_
per_pos`) but divides them by all drafts, so a drafter that proposed fewer than k tokens looks
as if its missing tokens had been rejected. Its scheduler already counts how many drafts had a
token at each position (`SpecDecodingStats.num_draft_tokens_per_pos`, vLLM 0.32 and 0.33) and
does not export it. This plugin wraps the API server's `SpecDecodingProm` so that each of its
updates also adds those counts to

    sparkserve_spec_decode_num_drafts_per_pos_total{model_name, engine, position}

and the dashboard's per-position acceptance is accepted at position p / drafts that reached p.
Never a reason for a server not to start: anything unexpected leaves vLLM's metrics as they
were and logs why once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("vllm.sparkserve.spec_metrics")

NAME = "sparkserve_spec_decode_num_drafts_per_pos"
_WRAPPED = "_sparkserve_drafts_per_pos_wrapped"
_COUNTERS: dict[tuple[str, ...], Any] = {}  # one counter per label set, per process


def _counter(labelnames: list[str]) -> Any:
    import prometheus_client

    key = (*labelnames, "position")
    if key not in _COUNTERS:
        _COUNTERS[key] = prometheus_client.Counter(
            name=NAME,
            documentation="Drafts that had a token at this draft position (sparkserve plugin).",
            labelnames=list(key),
        )
    return _COUNTERS[key]


def register() -> None:
    """Entry point (`vllm.general_plugins`): wrap SpecDecodingProm where this vLLM has it."""
    try:
        from vllm.v1.spec_decode import metrics
    except Exception:  # no such module in this vLLM, or it cannot import here
        return
    prom = getattr(metrics, "SpecDecodingProm", None)
    if prom is None or getattr(prom.__init__, _WRAPPED, False):
        return
    prom.__init__ = _wrap_init(prom.__init__)
    prom.observe = _wrap_observe(prom.observe)


def _wrap_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(
        self: Any,
        speculative_config: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
        *args: Any,
        **kwargs: Any,
    ) -> None:
        original(self, speculative_config, labelnames, per_engine_labelvalues, *args, **kwargs)
        self._sparkserve_reached = {}
        positions = getattr(speculative_config, "num_speculative_tokens", None)
        if not getattr(self, "spec_decoding_enabled", False) or not positions:
            return
        if kwargs.get("is_diffusion") or (args and args[0] is True):
            return
        try:
            counter = _counter(list(labelnames))
            self._sparkserve_reached = {
                engine: [counter.labels(*values, str(p)) for p in range(positions)]
                for engine, values in per_engine_labelvalues.items()
            }
        except Exception as error:  # never stop a server over a metric
            logger.warning("sparkserve: no %s (%s: %s)", NAME, type(error).__name__, error)

    setattr(__init__, _WRAPPED, True)
    return __init__


def _wrap_observe(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def observe(self: Any, spec_decoding_stats: Any, engine_idx: int = 0) -> None:
        original(self, spec_decoding_stats, engine_idx)
        counters = getattr(self, "_sparkserve_reached", {}).get(engine_idx, [])
        reached = getattr(spec_decoding_stats, "num_draft_tokens_per_pos", None) or []
        for counter, count in zip(counters, reached, strict=False):
            counter.inc(count)

    return observe
