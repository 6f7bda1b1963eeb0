"""The figures docs/ quotes from the JSON in docs/data (benchmarks, test runs), written from it.

`sparkserve docs sync` rewrites each generated region (between `>>> TAG:` and `<<< TAG`
markers) of docs/FINDINGS.md and docs/LMHEAD.md; `--check` (run by the tests) fails when a
region differs from what its JSON gives, so a table or a quoted range cannot drift from its data.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import Any

from sparkserve.knobs.docs import sync_regions

REPO = Path(__file__).resolve().parents[3]
TRITON38 = "docs/data/lmhead_bench_h200.json"  # the image's Triton
TRITON36 = "docs/data/lmhead_bench_h200_triton36.json"  # the H200 device's own
CI_RUNS = "docs/data/ci_runs.json"  # the suite's runs on the CPU machines
MAIN_SHAPE = (248320, 3072)  # Qwen3.5-122B-A10B's head


@cache
def _load(repo: Path, name: str) -> dict[str, Any]:
    return dict(json.loads((repo / name).read_text()))


def _shape(data: dict[str, Any], n: int, k: int) -> dict[str, Any]:
    return next(s for s in data["shapes"] if (s["N"], s["K"]) == (n, k))


def _rows_speedup(row: dict[str, Any]) -> float | None:
    rows_ms = row.get("rows_layout_int8_ms")
    return row["bf16_ms"] / rows_ms if rows_ms else None


def _span(values: Iterable[float], fmt: str) -> str:
    """`a-b` of the smallest and largest, or one value when they print alike."""
    found = sorted(values)
    low, high = format(found[0], fmt), format(found[-1], fmt)
    return low if low == high else f"{low}-{high}"


def _percent(values: Iterable[float]) -> str:
    return _span((100 * v for v in values), ".1f").replace("100.0", "100")


def _wrap(text: str, bullet: bool = False) -> list[str]:
    indent = "  " if bullet else ""
    return textwrap.wrap(text, 100, subsequent_indent=indent, break_on_hyphens=False)


def main_table(repo: Path, name: str) -> list[str]:
    rows = _shape(_load(repo, name), *MAIN_SHAPE)["rows"]
    lines = [
        "| M | bf16 ms | int8 ms | speedup | int8 / floor | target | int8 eager ms | host ms "
        "| rows ms | speedup (rows) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        target = "pass" if r["target_met"] else "miss"
        if r["floor_target"] is not None:
            target += f" (floor {r['floor_target']}x)"
        rows_ms, rows_speedup = r.get("rows_layout_int8_ms"), _rows_speedup(r)
        rows_cells = (
            f"{rows_ms:.4f} | {rows_speedup:.2f}" if rows_ms and rows_speedup else "n/a | n/a"
        )
        lines.append(
            f"| {r['M']} | {r['bf16_ms']:.4f} | {r['int8_ms']:.4f} | {r['speedup']:.2f} "
            f"| {r['int8_over_floor']:.3f} | {target} | {r['int8_eager_ms']:.4f} "
            f"| {r['int8_host_ms_per_call']:.3f} | {rows_cells} |"
        )
    return lines


def other_shapes_table(repo: Path, name: str) -> list[str]:
    data = _load(repo, name)
    others = [s for s in data["shapes"] if (s["N"], s["K"]) != MAIN_SHAPE]
    ms = [r["M"] for r in others[0]["rows"]]
    lines = [
        "| shape | " + " | ".join(f"M = {m}" for m in ms) + " |",
        "| --- |" + " --- |" * len(ms),
    ]
    for shape in others:
        cells = [f"{r['speedup']:.2f}x / {r['int8_over_floor']:.2f}" for r in shape["rows"]]
        lines.append(f"| {shape['N']} x {shape['K']} | " + " | ".join(cells) + " |")
    return lines


def _main_rows(repo: Path) -> list[dict[str, Any]]:
    return [
        r for name in (TRITON38, TRITON36) for r in _shape(_load(repo, name), *MAIN_SHAPE)["rows"]
    ]


def _all_shapes(repo: Path) -> list[dict[str, Any]]:
    return [s for name in (TRITON38, TRITON36) for s in _load(repo, name)["shapes"]]


def _logit_errors(shapes: list[dict[str, Any]]) -> list[float]:
    return [s["top1"][k]["max_abs_logit_err_vs_bf16_head"] for s in shapes for k in s["top1"]]


def summary(repo: Path) -> dict[str, str]:
    """The ranges the prose quotes, over both runs (Triton 3.8.0 and 3.6.0)."""
    rows = _main_rows(repo)
    shapes = _all_shapes(repo)
    passed = [r for r in rows if r["target_met"]]
    at = {m: [r for r in rows if r["M"] == m] for m in (1, 26, 39, 64)}
    rows_speedups = [s for r in rows if r["M"] <= 16 and (s := _rows_speedup(r))]
    return {
        "pass_m": f"M = {min(r['M'] for r in passed)} to {max(r['M'] for r in passed)}",
        "pass_speedup": _span((r["speedup"] for r in passed), ".2f"),
        "floor_1": _span((r["int8_over_floor"] for r in at[1]), ".2f"),
        "floor_26": _span((r["int8_over_floor"] for r in at[26]), ".2f"),
        "speedup_39": _span((r["speedup"] for r in at[39]), ".2f"),
        "speedup_64": _span((r["speedup"] for r in at[64]), ".2f"),
        "floor_64": _span((r["int8_over_floor"] for r in at[64]), ".2f"),
        "rows_upto_16": _span(rows_speedups, ".2f"),
        "rows_26": _span((s for r in at[26] if (s := _rows_speedup(r))), ".2f"),
        "rows_39": _span((s for r in at[39] if (s := _rows_speedup(r))), ".2f"),
        "rows_64": _span((s for r in at[64] if (s := _rows_speedup(r))), ".2f"),
        "rel_err": f"{max(r['rel_err'] for s in shapes for r in s['rows']):.1e}".replace("-0", "-"),
        "top1_peaked": _percent(s["top1"]["peaked"]["agreement"] for s in shapes),
        "top1_random": _percent(s["top1"]["random"]["agreement"] for s in shapes),
        "logit_err": f"{max(_logit_errors(shapes)):g}",
    }


def findings_summary(repo: Path) -> list[str]:
    f = summary(repo)
    return _wrap(
        f"Both runs, main shape: {f['pass_m']} pass ({f['pass_speedup']}x, {f['floor_1']}x the "
        f"floor at M = 1); M = 39 ({f['speedup_39']}x) and M = 64 ({f['speedup_64']}x, "
        f"{f['floor_64']}x the floor) miss. Over every shape and both runs: relative error at "
        f"most {f['rel_err']} against float64; top-1 agreement with the bf16 head "
        f"{f['top1_peaked']}% on peaked hidden states, {f['top1_random']}% on pure-random rows "
        f"(no flip with a top-2 gap over 0.125); largest |int8 - bf16| logit {f['logit_err']}."
    )


def lmhead_summary(repo: Path) -> list[str]:
    f = summary(repo)
    bullets = [
        f"- Correct everywhere: relative error at most {f['rel_err']} against a float64 product "
        "of the dequantised weights (bf16 output rounding); every output element written "
        "(NaN-poisoned before each run); top-1 agreement with the bf16 head "
        f'{f["top1_peaked"]}% on hidden states that point at a token ("peaked"), '
        f"{f['top1_random']}% on pure-random rows (every shape, both runs), where every "
        "disagreement was a near-tie.",
        f"- Main shape, `wgmma` layout (what the plugin picks on an H200): {f['pass_speedup']}x "
        f"faster than the bf16 head at {f['pass_m']} ({f['floor_1']}x the int8 floor at M = 1, "
        f"{f['floor_26']}x at 26): the targets hold there. At M = 39 {f['speedup_39']}x and at "
        f"M = 64 {f['speedup_64']}x ({f['floor_64']}x the floor): the 1.8x target is not met "
        "there.",
        f"- The `rows` layout on the same inputs: {f['rows_upto_16']}x up to M = 16, "
        f"{f['rows_26']}x, {f['rows_39']}x and {f['rows_64']}x at 26, 39 and 64 (at 26 the "
        'low end is the Triton 3.8 run: docs/FINDINGS.md, "The int8 lm-head").',
    ]
    return [line for bullet in bullets for line in _wrap(bullet, bullet=True)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else "-"


def ci_runs_table(repo: Path) -> list[str]:
    """One row per run, the commands and machines it names listed under it."""
    data = _load(repo, CI_RUNS)
    columns = ("date", "UTC", "machine", "command", "commit", "caches", "load", "wall")
    lines = [
        "| " + " | ".join((*columns, "user / sys", "pytest")) + " |",
        "|" + " --- |" * (len(columns) + 2),
    ]
    for run in data["runs"]:
        command = run["command"] + (f" ({run['variant']})" if run["variant"] else "")
        cells = (
            run["date"], run["utc"], run["machine"], command, run["commit"], run["caches"],
            run["load"], run["wall"], run["cpu_time"],
            f"`{run['pytest']}`" if " in " in run["pytest"] else run["pytest"],
        )  # fmt: skip
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    lines += ["", "Commands:", ""]
    lines += [f"- {name}: {text}" for name, text in data["commands"].items()]
    lines += ["", "Machines:", ""]
    lines += [f"- {name}: {text}" for name, text in data["machines"].items()]
    return lines


def _in(repo: Path, render: Callable[[Path], list[str]]) -> Callable[[str], list[str]]:
    return lambda indent: [indent + line if line else line for line in render(repo)]


def targets(repo: Path) -> list[tuple[str, str, Callable[[str], list[str]]]]:
    return [
        ("docs/FINDINGS.md", "lmhead-h200", _in(repo, lambda r: main_table(r, TRITON38))),
        ("docs/FINDINGS.md", "lmhead-h200-triton36", _in(repo, lambda r: main_table(r, TRITON36))),
        (
            "docs/FINDINGS.md",
            "lmhead-h200-shapes",
            _in(repo, lambda r: other_shapes_table(r, TRITON38)),
        ),
        ("docs/FINDINGS.md", "lmhead-h200-summary", _in(repo, findings_summary)),
        ("docs/LMHEAD.md", "lmhead-summary", _in(repo, lmhead_summary)),
        ("docs/FINDINGS.md", "ci-runs", _in(repo, ci_runs_table)),
    ]


def sync(repo: Path, check: bool) -> list[str]:
    """Rewrite (or with check, only compare) every generated region; return what drifted."""
    _load.cache_clear()
    return sync_regions(repo, targets(repo), check)
