"""What every benchmark here prints and writes: a Markdown table of its runs on stdout, and a
JSON record of the same runs with the date and the machine they ran on.

    from bench_record import record_runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Iterable, Mapping, Sequence
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


def record_runs(name: str, args: argparse.Namespace, columns: Sequence[str],
                runs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:  # fmt: skip
    """Print each run as a table row as it comes, then write them all to `args.json` (when
    given) with the command line's settings; returns the runs."""
    print_header(columns)
    done: list[Mapping[str, Any]] = []
    for run in runs:
        done.append(run)
        print_row(run, columns)
    json_path = getattr(args, "json", None)
    write_record(json_path, name, vars(args) | {"json": str(json_path)}, done)
    return done
