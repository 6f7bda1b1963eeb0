"""What every benchmark here prints and writes: a Markdown table of its runs on stdout, and a
JSON record of the same runs with the date and the machine they ran on.

    from bench_record import print_table, write_record
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """The machine a figure was measured on: cores, load average, kernel, CPU, Python."""
    return {
        "cpus": os.cpu_count(),
        "load": [round(x, 2) for x in os.getloadavg()],
        "kernel": platform.release(),
        "arch": platform.machine(),
        "python": platform.python_version(),
    }


def print_header(columns: Sequence[str]) -> None:
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns), flush=True)


def print_row(row: Mapping[str, Any], columns: Sequence[str]) -> None:
    print("| " + " | ".join(str(row.get(column, "")) for column in columns) + " |", flush=True)


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    print_header(columns)
    for row in rows:
        print_row(row, columns)


def write_record(path: Path | None, name: str, settings: Mapping[str, Any],
                 runs: Sequence[Mapping[str, Any]]) -> None:  # fmt: skip
    """The runs as JSON in `path` (nothing when None), with the date, machine and settings."""
    if path is None:
        return
    record = {
        "benchmark": name,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "settings": dict(settings),
        "runs": list(runs),
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
