"""verify's outputs: the table on stdout, verify.json, and verify.png (top-1 agreement per
generated position for the int8 head and for speculation). matplotlib is imported only when
drawing; a host without it gets the JSON and a note."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkserve.client.checks import Result, mark
from sparkserve.output.atomic_file import replace_figure


def table(results: list[tuple[str, Result]]) -> str:
    rows = ["| setting | check | result | detail |", "| --- | --- | --- | --- |"]
    for phase, result in results:
        rows.append(f"| {phase} | {result.name} | {mark(result.ok)} | {result.detail} |")
    return "\n".join(rows)


def failed(results: list[tuple[str, Result]]) -> list[str]:
    return [result.name for _, result in results if result.ok is False]


def plot(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [(r["name"], r["data"]["agreement_by_position"]) for r in document["results"]
             if r["data"].get("agreement_by_position")]  # fmt: skip
    fig, axis = plt.subplots(figsize=(8, 4))
    for name, shares in lines:
        axis.plot(range(len(shares)), shares, marker=".", label=name)
    axis.set_ylim(-0.05, 1.05)
    axis.set_xlabel("generated position (teacher-forced)")
    axis.set_ylabel("share of prompts: the reference's token is top-1")
    if lines:
        axis.legend(fontsize=8)
    verdict = document.get("outcome", "passed")
    if document["failed"]:
        verdict = "FAILED: " + ", ".join(document["failed"])
    elif document.get("not_tested"):
        verdict = "not tested: " + ", ".join(document["not_tested"])
    axis.set_title(f"sparkserve verify {document['prompt_set']}: {document['model']} - {verdict}",
                   fontsize=10)  # fmt: skip
    fig.tight_layout()
    replace_figure(fig, path, dpi=100)
    plt.close(fig)
