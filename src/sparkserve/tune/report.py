"""The tune's outputs: the JSON report and its plot, for each loop. matplotlib is imported only
here, when drawing (the image has it; a host without it gets the JSON and a note)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkserve.output.atomic_file import replace_figure
from sparkserve.output.plots import nan_for_none

COLOURS = {"PASS": "#2a9d4b", "FAIL": "#c0392b", "REFUSED": "#999999", "NO-START": "#e08e0b"}


def plot_memory(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trials = result["candidates"]
    labels = [f"{t['value']}\n{t['verdict']}" for t in trials]
    colours = [COLOURS.get(t["verdict"], "#555555") for t in trials]
    x = range(len(trials))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    panels = (
        ("KV pool (tokens)", [t["pool_tokens"] or 0 for t in trials]),
        ("lowest MemAvailable under load (GiB)", [t["min_available_gib"] or 0 for t in trials]),
        ("swap growth (MiB)", [(t["swap_growth_gib"] or 0) * 1024 for t in trials]),
    )
    for axis, (title, values) in zip(axes, panels, strict=True):
        axis.bar(x, values, color=colours)
        axis.set_title(title, fontsize=10)
        axis.set_xticks(list(x), labels, fontsize=8)
        axis.set_xlabel(result["knob"])
    axes[1].axhline(result["os_reserve_gib"], color="black", linestyle="--", linewidth=1)
    axes[1].text(0, result["os_reserve_gib"], " OS_RESERVE_GB", va="bottom", fontsize=8)
    kept = result["kept"]
    fig.suptitle(
        f"sparkserve tune memory: {result['model']} - kept {result['knob']}={kept}"
        if kept
        else f"sparkserve tune memory: {result['model']} - none passed",
        fontsize=11,
    )
    fig.tight_layout()
    replace_figure(fig, path, dpi=100)
    plt.close(fig)


def plot_draft(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["lengths"] if r.get("tok_s")]
    fig, (speed, accept) = plt.subplots(1, 2, figsize=(11, 4.2))
    speed.plot([r["length"] for r in rows], [r["tok_s"] for r in rows], marker="o")
    best = result["recommended"]
    for r in rows:
        if r["length"] == best:
            speed.plot([best], [r["tok_s"]], marker="*", markersize=16, color="#2a9d4b")
    speed.set_xlabel("draft length (NUM_SPEC_TOKENS)")
    speed.set_ylabel("decode tokens/s (whole workload)")
    speed.set_title("speed per draft length", fontsize=10)
    for r in rows:
        per_pos = r["spec"]["acceptance_per_position"]
        if per_pos:
            accept.plot(range(1, len(per_pos) + 1), nan_for_none(per_pos), marker=".",
                        label=f"k={r['length']}")  # fmt: skip
    accept.set_xlabel("draft position")
    accept.set_ylabel("accepted / drafts")
    accept.set_ylim(0, 1.05)
    accept.set_title("acceptance per position", fontsize=10)
    if accept.get_legend_handles_labels()[0]:
        accept.legend(fontsize=8)
    fig.suptitle(
        f"sparkserve tune draft: {result['model']}, {result['method']} - fastest k={best}",
        fontsize=11,
    )
    fig.tight_layout()
    replace_figure(fig, path, dpi=100)
    plt.close(fig)
