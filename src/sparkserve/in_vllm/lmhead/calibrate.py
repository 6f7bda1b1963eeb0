"""Measure, on the GPU the head runs on, which kernel configuration serves each row count fastest,
and whether the int8 head beats the bf16 one at all.

The built-in tables (``int8_kernel``) were tuned on an H200; another GPU or Triton release can make
an entry slow (the rows table's 17-32-row entry ran 0.54 ms with Triton 3.8 on an H200, against
0.39 ms for the bf16 head). So at load, before the bf16 weight is freed, ``calibrate`` times on the
head's real weights and random inputs of its shape, for every dispatch group the server can reach
(1 to ``max_rows`` rows: MAX_NUM_SEQS x (NUM_SPEC_TOKENS + 1); a group is timed at the most rows
it gets), in each weight layout this GPU can use (``rows`` everywhere, also ``wgmma`` on sm_90):

1. the bf16 head (the call vLLM would make) and the group's built-in entry;
2. then alternatives (``candidates``: the entry one stage shallower, the table's other entries,
   the fallback entries): first in the layout that did best, in every group where int8 lost to
   bf16, whatever the budget (the alternative is keeping bf16 for good, as the choice is cached);
   then in the other groups, slowest against bf16 first, while ``budget_s`` lasts.

Every candidate's output is checked against the bf16 head's first. An alternative replaces the
built-in entry only when it is ``MARGIN`` faster. The choice is int8 (in the layout whose best times
sum lowest) only if int8 is no slower than bf16 in every reached group; otherwise the bf16 head
stays. Timing (``event_timer``): one call between two CUDA events, after a write over twice the L2
cache and queued behind a GPU sleep (so Python's launch cost is not counted), in ``ROUNDS``
interleaved rounds; the median counts. Most of a first calibration's time is Triton compiling
the candidates (its measurements on an H200: benchmarks/NOTES-lmhead.md, calibration at load).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from . import layout
from .int8_kernel import (
    GLUON_FALLBACK,
    WGMMA_FALLBACK,
    KernelConfig,
    Table,
    built_in_table,
    fewer_stages,
    int8_linear,
)

__all__ = [
    "BF16",
    "BUDGET_S",
    "Group",
    "HeadChoice",
    "Timer",
    "built_in_choice",
    "calibrate",
    "candidates",
    "describe",
    "event_timer",
    "groups",
]

BF16 = "bf16"  # the bf16 head, as a candidate
BUDGET_S = 5.0  # alternatives start only while calibration has taken less than this
ROUNDS = 10  # timed samples per candidate and group; the median counts
MAX_TIMED_ROWS = 256  # a group beyond this is timed at this many rows
MAX_REL_ERR = 0.03  # a candidate's output against the bf16 head's (int8 rounding is ~0.4%)
MARGIN = 0.03  # an alternative must beat the built-in entry by this share (timing noise is ~1-2%)

Choice = Any  # a KernelConfig, or BF16
# (rows, {choice: call}) -> {choice: milliseconds per call}
Timer = Callable[[int, Mapping[Choice, Callable[[], Any]]], dict[Choice, float]]


@dataclasses.dataclass(frozen=True)
class Group:
    """One dispatch group as timed: rows ``m`` (the largest the server reaches in it) of the
    group ``(lo, bound]``; the bf16 head's time, the built-in entry's, the best and which."""

    bound: int
    m: int
    bf16_ms: float
    table_ms: float | None  # None: the built-in entry failed or was wrong
    best_ms: float | None  # None: no int8 candidate was correct
    best: KernelConfig | None
    tried: int
    skipped: int = 0  # candidates the budget left out

    @property
    def int8_wins(self) -> bool:
        return self.best_ms is not None and self.best_ms <= self.bf16_ms


@dataclasses.dataclass(frozen=True)
class HeadChoice:
    """What the plugin serves: ``path`` "int8" with ``layout`` and its launch ``table``, or
    "bf16". ``source``: "measured", "cache" or "table" (built in, nothing measured)."""

    path: str
    layout: str
    table: Table
    groups: tuple[Group, ...] = ()
    max_rows: int = 0
    seconds: float = 0.0
    source: str = "table"
    note: str = ""  # why bf16, or what was cut short
    layouts: tuple[tuple[str, float], ...] = ()  # (layout, sum of its best times) as measured

    def summary(self) -> str:
        """One line: what was chosen and why, with the numbers."""
        if self.source == "table":
            return f"built-in table ({self.note})" if self.note else "built-in table"
        if not self.groups:  # nothing was measured: the note says why
            return self.note
        where = "measured" if self.source == "measured" else "from the cache"
        parts = [_group_words(g) for g in self.groups]
        lays = ", ".join(f"{name} {ms:.3f}" for name, ms in self.layouts)
        text = f"calibrated ({where}, {self.seconds:.1f} s, rows 1-{self.max_rows}): " + "; ".join(
            parts
        )
        if len(self.layouts) > 1:
            text += f"; {self.layout} layout (sum of best ms: {lays})"
        if self.note:
            text += f"; {self.note}"
        return text


def _group_words(g: Group) -> str:
    """e.g. "M<=16 0.196 ms mmab 16x128x256 s3 vs bf16 0.381, 1.94x" (plus the table entry's
    time where another configuration won)."""
    if g.best_ms is None:
        return f"M<={g.m} no correct int8 kernel vs bf16 {g.bf16_ms:.3f}"
    text = f"M<={g.m} {g.best_ms:.3f} ms {describe(g.best)}"
    if g.best_ms != g.table_ms:
        text += " (table " + ("failed" if g.table_ms is None else f"{g.table_ms:.3f}") + ")"
    return text + f" vs bf16 {g.bf16_ms:.3f}, {g.bf16_ms / g.best_ms:.2f}x"


def built_in_choice(weight_layout: str, note: str = "") -> HeadChoice:
    return HeadChoice("int8", weight_layout, built_in_table(weight_layout), note=note)


def describe(cfg: KernelConfig | None) -> str:
    """A config in a few words, for log lines."""
    if cfg is None:
        return "none"
    if cfg.kind == "wgmma":
        return (
            f"wgmma s{cfg.num_stages}" + (f"/x{cfg.x_stages}" if cfg.x_stages else "")
            + f" ch{cfg.chunks}" + (" stagger" if cfg.stagger else "")
        )  # fmt: skip
    if cfg.kind == "gluon":
        return f"gluon bn{cfg.block_n} bk{cfg.block_k} s{cfg.num_stages}"
    split = f" x{cfg.split_m}" if cfg.split_m > 1 else ""
    return f"mmab {cfg.block_m}x{cfg.block_n}x{cfg.block_k} s{cfg.num_stages}{split}"


def groups(table: Table, max_rows: int) -> list[tuple[int, int]]:
    """(bound, rows to time) for each of ``table``'s groups that 1..``max_rows`` rows reach."""
    out = []
    lo = 1
    for bound, _ in table:
        if lo > max_rows:
            break
        out.append((bound, min(bound, max_rows, MAX_TIMED_ROWS)))
        lo = bound + 1
    return out


def candidates(m: int, weight_layout: str, table: Table) -> list[KernelConfig]:
    """Configurations that can serve ``m`` rows of a weight in ``weight_layout``: the table's
    entry for ``m`` first, then it one pipeline stage shallower (a stage count tuned for another
    GPU is the likeliest fault), the table's other entries, the layout's fallback entries, and
    these one stage shallower."""
    own = next((c for b, c in table if m <= b), table[-1][1])
    fallback = WGMMA_FALLBACK if weight_layout == layout.WGMMA else GLUON_FALLBACK
    others = [c for _, c in table] + [c for _, c in fallback]
    pool = [own, fewer_stages(own), *others, *map(fewer_stages, others)]
    out: list[KernelConfig] = []
    for cfg in pool:
        if cfg is not None and cfg not in out and _can_serve(cfg, m, weight_layout):
            out.append(cfg)
    return out


def _can_serve(cfg: KernelConfig, m: int, weight_layout: str) -> bool:
    if cfg.kind == "wgmma":
        return weight_layout == layout.WGMMA and m <= 64
    if cfg.kind == "gluon":
        return weight_layout == layout.ROWS and m <= 64
    if weight_layout == layout.WGMMA:  # Triton reads whole [128, 64] tiles
        return cfg.kind == "mmab" and cfg.block_n == layout.TILE_ROWS and cfg.block_k % 64 == 0
    return cfg.kind == "mmab"


def event_timer(m: int, calls: Mapping[Choice, Callable[[], Any]]) -> dict[Choice, float]:
    """Milliseconds per call of each of ``calls`` (already warm) on the current CUDA device: the
    median of ``ROUNDS`` interleaved samples. A sample is one call between two events, after a
    write over twice the L2 cache (as the model's own work leaves it between two heads), queued
    behind a GPU sleep so that the GPU never waits for Python's launch."""
    del m
    keys = list(calls)
    samples: dict[Choice, list[float]] = {key: [] for key in keys}
    flush = _l2_buffer()
    for r in range(ROUNDS):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]  # no candidate always first
        events = []
        for key in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            _gpu_sleep()
            flush.zero_()
            start.record()
            calls[key]()
            end.record()
            events.append((key, start, end))
        torch.cuda.synchronize()
        for key, start, end in events:
            samples[key].append(start.elapsed_time(end))
    return {key: statistics.median(v) for key, v in samples.items()}


def _l2_buffer() -> torch.Tensor:
    """Twice the L2 cache, for one timing call. Not kept between calls: a buffer that outlived
    the calibration (about 0.12 GiB on an H200) stayed allocated when vLLM profiled, and the
    first start's KV pool came out that much smaller than a later start's (H200 starts,
    docs/FINDINGS.md); torch's caching allocator hands the same block to the next call."""
    device = torch.cuda.current_device()
    size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 << 20
    return torch.empty(2 * size // 4, dtype=torch.int32, device=device)


def _gpu_sleep() -> None:
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(1_000_000)  # about 0.5 ms of GPU time in which Python queues the sample


def calibrate(
    weights: Mapping[str, torch.Tensor],
    scale: torch.Tensor,
    bf16: Callable[[torch.Tensor], torch.Tensor],
    *,
    max_rows: int,
    dtype: torch.dtype = torch.bfloat16,
    budget_s: float = BUDGET_S,
    tables: Mapping[str, Table] | None = None,
    timer: Timer | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> HeadChoice:
    """Time the candidates of every reachable group for each packed weight in ``weights``
    (layout -> tensor; the first layout's alternatives are tried first) against ``bf16(x)``, and
    return the choice. ``tables`` overrides the built-in table per layout (benchmarks: a table with
    a deliberately bad entry); ``timer`` defaults to ``event_timer``. Raises what a broken GPU
    raises; the caller falls back."""
    timer = timer or event_timer
    t0 = clock()
    k = next(iter(weights.values())).shape[1]
    device = scale.device
    reach = max(1, max_rows)
    inputs: dict[int, torch.Tensor] = {}
    references: dict[int, torch.Tensor] = {}
    entries: list[_Entry] = []
    for lay in weights:  # pass 1: bf16 and the built-in entry of every group
        base = (tables or {}).get(lay) or built_in_table(lay)
        for bound, m in groups(base, reach):
            if m not in inputs:
                inputs[m] = torch.randn(m, k, device=device, dtype=dtype)
                references[m] = bf16(inputs[m])
            entry = _Entry(lay, bound, m, candidates(m, lay, base))
            entry.group = entry.time(inputs[m], references[m], weights[lay], scale, bf16, timer,
                                     lambda: True)  # fmt: skip
            entries.append(entry)
    # pass 2, the alternatives: the layout that did best first; in it, groups where int8 loses
    # (whatever the budget: the alternative is the bf16 head) and then the slowest against bf16
    sums = {lay: sum(e.ratio for e in entries if e.layout == lay) for lay in weights}
    first = min(sums, key=lambda lay: sums[lay])
    order = sorted(entries, key=lambda e: (e.layout != first, e.group.int8_wins, -e.ratio))
    for e in order:
        must = e.layout == first and not e.group.int8_wins
        if len(e.cands) < 2 or (not must and clock() - t0 > budget_s):
            continue
        deadline = math.inf if must else t0 + budget_s
        e.group = e.time(inputs[e.m], references[e.m], weights[e.layout], scale, bf16, timer,
                         lambda d=deadline: clock() > d)  # fmt: skip
    per_layout: dict[str, tuple[Table, list[Group]]] = {}
    for lay in weights:
        base = (tables or {}).get(lay) or built_in_table(lay)
        timed = [e.group for e in entries if e.layout == lay]
        per_layout[lay] = (_merge(base, timed), timed)
    totals = {
        lay: sum(g.best_ms if g.best_ms is not None else math.inf for g in gs)
        for lay, (_, gs) in per_layout.items()
    }
    chosen = min(totals, key=lambda lay: totals[lay])
    table, timed = per_layout[chosen]
    seconds = clock() - t0
    layouts = tuple((lay, totals[lay]) for lay in per_layout)
    losing = [g for g in timed if not g.int8_wins]
    if losing:
        worst = losing[0]
        best = "no correct int8 kernel" if worst.best_ms is None else f"{worst.best_ms:.3f} ms"
        note = f"int8 ({best}) is slower than bf16 ({worst.bf16_ms:.3f} ms) at M={worst.m}"
        return HeadChoice(
            BF16, chosen, table, tuple(timed), reach, seconds, "measured", note, layouts
        )
    skipped = sum(g.skipped for gs in per_layout.values() for g in gs[1])
    note = f"{skipped} alternatives left out (budget {budget_s:.0f} s)" if skipped else ""
    return HeadChoice(
        "int8", chosen, table, tuple(timed), reach, seconds, "measured", note, layouts
    )


@dataclasses.dataclass
class _Entry:
    """One group of one layout while it is being calibrated."""

    layout: str
    bound: int
    m: int
    cands: list[KernelConfig]
    group: Group | None = None

    @property
    def ratio(self) -> float:
        """The best int8 time over bf16's (inf: no correct int8 kernel)."""
        g = self.group
        return math.inf if g is None or g.best_ms is None else g.best_ms / g.bf16_ms

    def time(self, x, reference, weight, scale, bf16, timer, over_budget) -> Group:  # noqa: ANN001
        return _time_group(self.bound, self.m, x, reference, weight, scale, self.layout,
                           self.cands, bf16, timer, over_budget)  # fmt: skip


def _merge(base: Table, timed: list[Group]) -> Table:
    best = {g.bound: g.best for g in timed if g.best is not None}
    return tuple((bound, best.get(bound, cfg)) for bound, cfg in base)


def _time_group(
    bound: int,
    m: int,
    x: torch.Tensor,
    reference: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    weight_layout: str,
    cands: list[KernelConfig],
    bf16: Callable[[torch.Tensor], torch.Tensor],
    timer: Timer,
    over_budget: Callable[[], bool],
) -> Group:
    """Time bf16, the built-in entry ``cands[0]`` and further candidates until
    ``over_budget()``. An alternative replaces the entry only if it is faster by ``MARGIN``."""
    out = torch.empty(m, scale.shape[0], device=x.device, dtype=x.dtype)
    calls: dict[Choice, Callable[[], Any]] = {BF16: lambda: bf16(x)}
    tried = 0
    for i, cfg in enumerate(cands):
        if i > 0 and over_budget():
            break
        tried += 1

        def call(cfg: KernelConfig = cfg) -> Any:
            return int8_linear(x, weight, scale, out=out, config=cfg, weight_layout=weight_layout)

        try:
            out.fill_(float("nan"))
            call()  # compiles, and fits the stages to this GPU's shared memory
        except Exception:  # a configuration this GPU or Triton cannot run is no candidate
            continue
        if _rel_err(out, reference) <= MAX_REL_ERR:
            calls[cfg] = call
    times = timer(m, calls)
    int8 = {c: t for c, t in times.items() if c != BF16}
    table_ms = int8.get(cands[0])
    best = min(int8, key=lambda c: int8[c]) if int8 else None
    if best is not None and table_ms is not None and int8[best] > table_ms * (1 - MARGIN):
        best = cands[0]  # within the noise of the built-in entry: keep it
    return Group(
        bound=bound,
        m=m,
        bf16_ms=times[BF16],
        table_ms=table_ms,
        best_ms=int8[best] if best is not None else None,
        best=best,
        tried=tried,
        skipped=len(cands) - tried,
    )


def _rel_err(out: torch.Tensor, reference: torch.Tensor) -> float:
    """Relative Frobenius error (inf for NaN or an unwritten output)."""
    diff = (out.float() - reference.float()).norm()
    ref = reference.float().norm()
    err = float(diff / ref) if float(ref) > 0 else float(diff)
    return err if math.isfinite(err) else math.inf
