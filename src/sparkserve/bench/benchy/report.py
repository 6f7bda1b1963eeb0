"""llama-benchy's result joined with the /metrics windows: its own table (as llama-benchy
prints it, for comparing with other Spark owners), a table of what the server counted in each
test, and a plot of tokens/s over depth for each concurrency."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

from sparkserve.bench.report import tokens_per_s_axes
from sparkserve.client import metrics
from sparkserve.output.atomic_file import replace_figure
from sparkserve.output.plots import nan_for_none


def join(benchmarks: list[dict[str, Any]], tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each llama-benchy row with its test's settings: a test at a depth gives two rows (the
    context load, then the prompt after it; prefix caching is on in every profile), one at
    depth 0 gives one. Rows beyond the tests seen (a run cut short) are left out; a row of a
    test that was cut short (llama-benchy may save it in the moment Ctrl-C lands) is kept and
    labelled `cut_short`. Each row also gets `decode_steps_s`: its client tokens/s divided
    by the test's mean accepted length (`decode_steps`)."""
    rows: list[dict[str, Any]] = []
    at = 0
    for test in tests:
        for _ in range(2 if test["depth"] > 0 else 1):
            if at >= len(benchmarks):
                return rows
            row = benchmarks[at]
            if row["concurrency"] != test["concurrency"]:
                raise ValueError(
                    f"llama-benchy's row {at} has concurrency {row['concurrency']}, its test "
                    f"{test['concurrency']}: the output does not follow llama-benchy 0.4.0's order"
                )
            rows.append({**row, "depth": test["depth"], "pp": test["pp"], "tg": test["tg"],
                         "cut_short": test["cut_short"],
                         "decode_steps_s": decode_steps(row, test)})  # fmt: skip
            at += 1
    return rows


# what the figures count, said beside every table of them: a harness that counts streamed
# chunks (or decode steps) as tokens reports steps/s, which under speculation is less than the
# tokens a client receives
WHICH_IS_WHICH = (
    "Client tok/s is llama-benchy's tg figure: generated tokens as the client received them "
    "(counted from the stream's usage), per second. Decode steps/s is the server's forward "
    "passes per second: client tok/s divided by the mean accepted length from /metrics "
    "(1 + accepted / drafts; each step emits one token plus the drafts it accepted). Without "
    "speculation the two are the same; a harness that counts streamed chunks as tokens "
    "reports decode steps/s."
)


def decode_steps(row: dict[str, Any], test: dict[str, Any]) -> float | None:
    """A row's decode steps per second: its client tokens/s / its test's mean accepted length."""
    tg = row.get("tg_throughput")
    rate = tg.get("mean") if isinstance(tg, dict) else None
    return metrics.steps_per_s(rate, test["speculation"])


def name_of_test(test: dict[str, Any]) -> str:
    depth = f" @ d{test['depth']}" if test["depth"] else ""
    return f"pp{test['pp']} tg{test['tg']}{depth} (c{test['concurrency']})"


def llama_benchy_table(document: dict[str, Any], out: Path) -> str:
    """llama-benchy's own markdown table of its JSON result (written to `out` too)."""
    from llama_benchy.results import BenchmarkMetadata, BenchmarkResults, BenchmarkRun

    result = document["llama_benchy"]["result"]
    if not result or not result.get("benchmarks"):
        return "llama-benchy wrote no result.\n"
    table = BenchmarkResults()
    table.model_name = result["model"]
    table.metadata = BenchmarkMetadata(
        **{key: result[key] for key in BenchmarkMetadata.model_fields}
    )
    table.runs = [BenchmarkRun(**row) for row in result["benchmarks"]]
    with contextlib.redirect_stdout(io.StringIO()):  # its "Saving results to ..." line
        table.save_report(str(out), "md", result["max_concurrency"])
    return out.read_text() + "\n"


# why llama-benchy leaves a figure out: it times prompt processing from a request's start to
# its first token, and decode between a request's first and last streamed token; vLLM merges a
# stream's pending outputs while its reader lags, so a starved server or client can deliver
# every token in one chunk, with no time between them to divide by
NOT_TIMED = {
    "pp": "llama-benchy timed no prompt processing (no first token after a request's start)",
    "tg": "llama-benchy timed no decode (each request's tokens reached it in one streamed "
          "chunk: the server or this client was short of CPU); run it again on a quiet machine",
}  # fmt: skip


def row_name(row: dict[str, Any]) -> str:
    """A joined row's test, and which of its two sends (the context load, at a depth)."""
    return name_of_test(row) + (", context load" if row["is_context_prefill_phase"] else "")


def unmeasured(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The figures llama-benchy left empty (its table shows a blank cell), each with why."""
    return [
        {"test": row_name(row), "phase": phase, "why": why}
        for row in rows
        for phase, why in NOT_TIMED.items()
        if row[f"{phase}_throughput"] is None
    ]


def _f(value: Any, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def metrics_table(tests: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    lines = [
        "| test | client tok/s | decode steps/s | mean accepted length | acceptance per draft "
        "position | prefix-cache hits (tokens) | hit rate | peak KV cache usage |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for test in tests:
        # the test's own row (at a depth: the prompt after the context load)
        mine = [r for r in rows if name_of_test(r) == name_of_test(test)
                and not r["is_context_prefill_phase"]]  # fmt: skip
        tg = (mine[0].get("tg_throughput") or {}) if mine else {}
        client = tg.get("mean") if isinstance(tg, dict) else None
        steps = mine[0]["decode_steps_s"] if mine else None
        spec, prefix = test["speculation"], test["prefix_cache"]
        per = spec["acceptance_per_position"]
        positions = " ".join(_f(p) for p in per) if per else "n/a"
        rate = prefix["hit_rate"]
        peak = test["kv_cache_usage_peak"]
        lines.append(
            f"| {name_of_test(test)}{' (cut short)' if test['cut_short'] else ''} "
            f"| {_f(client, 1)} | {_f(steps, 1)} "
            f"| {_f(spec['mean_acceptance_length'], 3)} | {positions} "
            f"| {_f(prefix['hits'], 0)} of {_f(prefix['queries'], 0)} "
            f"| {'n/a' if rate is None else f'{rate:.1%}'} "
            f"| {'n/a' if peak is None else f'{peak:.1%}'} |"
        )
    return "\n".join(lines) + "\n"


def markdown(document: dict[str, Any], benchy_table: str) -> str:
    head = (
        f"# llama-benchy {document['llama_benchy']['version']}, profile "
        f"{document['profile']['name']}: {document['model']} on {document['image']} image, "
        f"vLLM {document['vllm']}, corpus {document['corpus']['url']}\n\n"
    )
    gaps = "".join(f"- {u['test']}, {u['phase']}: {u['why']}\n" for u in document["unmeasured"])
    if gaps:
        benchy_table += "\nNot measured (a blank cell above):\n" + gaps
    return (
        head + benchy_table + "\nWhat the server's /metrics counted over each test (its "
        "warm-up run included). "
        + WHICH_IS_WHICH
        + "\n\n"
        + metrics_table(document["tests"], document["rows"])
    )


def plot(document: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in document["rows"] if not r["is_context_prefill_phase"]]
    fig, (pp_ax, tg_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for level in sorted({r["concurrency"] for r in rows}):
        mine = sorted((r for r in rows if r["concurrency"] == level), key=lambda r: r["depth"])
        depths = [r["depth"] for r in mine]
        for ax, key in ((pp_ax, "pp_throughput"), (tg_ax, "tg_throughput")):
            means = nan_for_none([r[key]["mean"] if r[key] else None for r in mine])
            ax.plot(depths, means, "o-", label=f"c{level}")
    profile = document["profile"]
    for ax, what in ((pp_ax, f"pp{profile['pp']}"), (tg_ax, f"tg{profile['tg']}")):
        title = f"{what}: tokens/s (total over the concurrent requests)"
        tokens_per_s_axes(ax, title, "context depth (tokens)", legend=bool(rows))
    fig.suptitle(
        f"llama-benchy {document['llama_benchy']['version']} ({profile['name']}): "
        f"{document['model']}, {document['image']} image, vLLM {document['vllm']} "
        f"({document['started_at']})",
        fontsize=10,
    )
    fig.tight_layout()
    replace_figure(fig, out, dpi=110)
    plt.close(fig)
    return out
