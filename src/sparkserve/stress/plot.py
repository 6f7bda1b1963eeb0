"""The stress run's PNG: memory over time, the concurrency phases shaded, the OS reserve as a
line, the worst moment marked; below it, swap traffic and the KV pool's fill."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparkserve.output.atomic_file import replace_figure
from sparkserve.stress.sampler import Sample


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(
    samples: Sequence[Sample],
    phases: Sequence[dict[str, Any]],
    os_reserve_gib: float,
    worst_t: float | None,
    title: str,
    out: Path,
    worst_label: str = "worst moment",
) -> Path:
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]}
    )
    t = [s.t for s in samples]
    top.plot(t, [s.mem_available_gib for s in samples], label="MemAvailable", color="tab:blue")
    top.plot(t, [s.mem_used_gib for s in samples], label="used", color="tab:orange")
    top.plot(t, [s.swap_used_gib for s in samples], label="swap used", color="tab:purple")
    gpu = [(s.t, s.gpu_used_gib) for s in samples if s.gpu_used_gib is not None]
    if gpu:
        top.plot([g[0] for g in gpu], [g[1] for g in gpu], label="GPU used", color="tab:green")
    top.axhline(os_reserve_gib, color="red", linestyle="--", label=f"OS reserve {os_reserve_gib:g}")
    colours = ("#f2f2f2", "#e0e8f5")
    for i, phase in enumerate(phases):
        start, end = phase.get("start_t"), phase.get("end_t")
        if start is None:
            continue
        end = end if end is not None else (t[-1] if t else start)
        for axis in (top, bottom):
            axis.axvspan(start, end, color=colours[i % 2], zorder=0)
        top.text(
            (start + end) / 2, 1.0, str(phase["name"]), transform=top.get_xaxis_transform(),
            ha="center", va="bottom", fontsize=9,
        )  # fmt: skip
    if worst_t is not None and samples:
        worst = min(samples, key=lambda s: abs(s.t - worst_t))
        top.plot([worst.t], [worst.mem_available_gib], "rv", markersize=9, label=worst_label)
    top.set_ylabel("GiB")
    top.set_ylim(bottom=0)
    top.legend(loc="upper right", fontsize=8, ncol=3, framealpha=0.9)
    top.grid(alpha=0.3)
    top.set_title(title, fontsize=10, pad=16)

    bottom.plot(t, [s.swap_in_mib_s for s in samples], label="swap-in MiB/s", color="tab:cyan")
    bottom.plot(t, [s.swap_out_mib_s for s in samples], label="swap-out MiB/s", color="tab:red")
    bottom.set_ylim(bottom=0)
    bottom.set_ylabel("swap MiB/s")
    bottom.set_xlabel("seconds since start")
    bottom.grid(alpha=0.3)
    kv = [(s.t, s.kv_usage * 100) for s in samples if s.kv_usage is not None]
    psi = [(s.t, s.psi_full_pct) for s in samples if s.psi_full_pct is not None]
    handles, labels = bottom.get_legend_handles_labels()
    if kv or psi:
        right = bottom.twinx()
        if kv:
            right.plot([k[0] for k in kv], [k[1] for k in kv], color="tab:gray", label="KV pool %")
        if psi:
            right.plot([p[0] for p in psi], [p[1] for p in psi], color="tab:purple",
                       linestyle=":", label="memory stall % (PSI full)")  # fmt: skip
        right.set_ylabel("KV pool used / memory stall %")
        right.set_ylim(0, 105)
        more_h, more_l = right.get_legend_handles_labels()
        handles, labels = handles + more_h, labels + more_l
    bottom.legend(handles, labels, loc="upper left", fontsize=8, ncol=3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    replace_figure(fig, out, dpi=110)
    plt.close(fig)
    return out
