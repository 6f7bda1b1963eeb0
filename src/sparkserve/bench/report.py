"""The bench's Markdown tables and its PNG (four panels)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from sparkserve.output.atomic_file import replace_figure
from sparkserve.output.plots import nan_for_none


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


# which figure is which, said beside the table (harnesses differ: under speculation, one that
# counts streamed chunks as tokens reports decode steps/s)
WHICH_IS_WHICH = (
    "Tokens/s count generated tokens: tok/s per stream is vLLM's time per output token "
    "(the client's figure where the server has none), client tok/s is the tokens as this "
    "client received them over the stream. Decode steps/s is the target's forward passes per "
    "second: client tok/s divided by the mean accepted length from /metrics (1 + accepted / "
    "drafts: each step emits one token plus the drafts it accepted). Without speculation the "
    "two are the same; a harness that counts streamed chunks as tokens reports decode steps/s."
)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# sparkserve bench: {result['model']} at {result['url']}",
        "",
        f"{result['started_at']}; API `{result['config']['api']}`; {result['config']['gen_tokens']}"
        f" generated tokens per request; status {result['status']}.",
        "",
    ]
    ttft = result.get("ttft")
    if ttft:
        tokens = [r["cold"]["prompt_tokens"] for r in ttft["rounds"]]
        lines += [
            "## Time to first token on a shared prefix",
            "",
            "| prompt tokens | cold TTFT s | warm TTFT s | cold / warm | "
            "server's cold / warm TTFT s | warm prefix hit rate |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        warm_hits = [r["warm"]["hit_rate"] for r in ttft["rounds"]]
        hit = warm_hits[-1] if warm_hits else None
        server = [
            _median([r[k]["server_ttft_s"] for r in ttft["rounds"]]) for k in ("cold", "warm")
        ]
        lines.append(
            f"| {_f(tokens[0] if tokens else None)} | {_f(ttft['cold_ttft_s'], 3)} | "
            f"{_f(ttft['warm_ttft_s'], 3)} | {_f(ttft['speedup'], 1)}x | {_f(server[0], 3)} / "
            f"{_f(server[1], 3)} | {_pct(hit)} |"
        )
        lines.append("")
    lines += [
        "## Decode",
        "",
        WHICH_IS_WHICH,
        "",
        "| kind | concurrency | tok/s per stream | client tok/s per stream | decode steps/s per "
        "stream | mean accepted length | aggregate tok/s | mean TTFT s | prefix hit rate |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["decode"]:
        lines.append(
            f"| {row['kind']} | {row['concurrency']} | {_f(row['per_stream_tok_s'], 1)} | "
            f"{_f(row.get('client_per_stream_tok_s'), 1)} | "
            f"{_f(row.get('decode_steps_s_per_stream'), 1)} | "
            f"{_f(row['spec']['mean_acceptance_length'])} | "
            f"{_f(row['aggregate_tok_s'], 1)} | {_f(row['ttft_s_mean'], 3)} | "
            f"{_pct(row['prefix']['hit_rate'])} |"
        )
    by_kind = result.get("acceptance_by_kind") or {}
    if by_kind:
        width = max((len(a["acceptance_per_position"] or []) for a in by_kind.values()), default=0)
        heads = [f"pos {i}" for i in range(width)] or ["per position"]
        of = next(iter(by_kind.values())).get("acceptance_per_position_of", "all drafts")
        lines += [
            "",
            f"## Speculative decoding by kind (accepted at each draft position / {of})",
            "",
            "| kind | drafts | accepted | acceptance length | " + " | ".join(heads) + " |",
            "| --- | --- | --- | --- |" + " --- |" * len(heads),
        ]
        for kind, acc in by_kind.items():
            per = acc["acceptance_per_position"] or []
            cells = [_pct(p) for p in per] + ["n/a"] * (len(heads) - len(per))
            lines.append(
                f"| {kind} | {_f(acc['drafts'], 0)} | {_f(acc['accepted'], 0)} | "
                f"{_f(acc['mean_acceptance_length'])} | " + " | ".join(cells) + " |"
            )
    overall = result.get("overall")
    if overall:
        lines += [
            "",
            "## Whole run (server counters, first to last /metrics read)",
            "",
            f"- mean acceptance length: {_f(overall['spec']['mean_acceptance_length'], 3)}",
            f"- prefix-cache hit rate: {_pct(overall['prefix']['hit_rate'])} "
            f"({_f(overall['prefix']['hits'], 0)} of {_f(overall['prefix']['queries'], 0)} "
            "tokens)",
        ]
    return "\n".join(lines) + "\n"


def tokens_per_s_axes(ax: Any, title: str, xlabel: str, legend: bool) -> None:
    """A tokens/s panel: titled, from 0, gridded, with its lines' legend when it has lines."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("tokens/s")
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
    if legend:
        ax.legend(fontsize=8)


def plot(result: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (ttft_ax, stream_ax), (agg_ax, pos_ax) = axes
    ttft = result.get("ttft")
    if ttft and ttft["cold_ttft_s"] is not None:
        values = [ttft["cold_ttft_s"], ttft["warm_ttft_s"] or 0.0]
        bars = ttft_ax.bar(["cold", "warm"], values, color=["tab:red", "tab:green"])
        ttft_ax.bar_label(bars, fmt="%.3f s")
        tokens = ttft["rounds"][0]["cold"]["prompt_tokens"] if ttft["rounds"] else None
        ttft_ax.set_title(f"TTFT on a shared {tokens}-token prompt (median)")
    else:
        ttft_ax.text(0.5, 0.5, "TTFT not measured", ha="center", transform=ttft_ax.transAxes)
    ttft_ax.set_ylabel("seconds")
    kinds = list(dict.fromkeys(row["kind"] for row in result["decode"]))
    for kind in kinds:
        rows = [r for r in result["decode"] if r["kind"] == kind]
        levels = [r["concurrency"] for r in rows]
        stream_ax.plot(levels, [r["per_stream_tok_s"] or 0 for r in rows], "o-", label=kind)
        agg_ax.plot(levels, [r["aggregate_tok_s"] or 0 for r in rows], "o-", label=kind)
    for ax, what in ((stream_ax, "decode tok/s per stream"), (agg_ax, "aggregate decode tok/s")):
        tokens_per_s_axes(ax, what, "concurrent requests", legend=bool(kinds))
        if kinds:
            levels = sorted({r["concurrency"] for r in result["decode"]})
            ax.set_xticks(levels)
    by_kind = result.get("acceptance_by_kind") or {}
    drawn = False
    for kind, acc in by_kind.items():
        per = acc.get("acceptance_per_position")
        if per:
            length = acc["mean_acceptance_length"]
            pos_ax.plot(range(len(per)), nan_for_none(per), "o-",
                        label=f"{kind} (length {length:.2f})")  # fmt: skip
            drawn = True
    if drawn:
        pos_ax.set_ylim(0, 1.05)
        pos_ax.legend(fontsize=8)
        pos_ax.set_xticks(
            range(max(len(a.get("acceptance_per_position") or []) for a in by_kind.values()))
        )
        pos_ax.set_xlabel("draft position")
        pos_ax.set_ylabel("accepted / drafts")
    else:
        pos_ax.text(
            0.5, 0.5, "no speculative decoding counters (n/a)", ha="center",
            transform=pos_ax.transAxes,
        )  # fmt: skip
    pos_ax.set_title("acceptance per draft position")
    pos_ax.grid(alpha=0.3)
    fig.suptitle(f"sparkserve bench: {result['model']} ({result['started_at']})", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    replace_figure(fig, out, dpi=110)
    plt.close(fig)
    return out
