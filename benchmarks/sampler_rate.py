"""The rate the stress tool's memory sampler keeps while its own process is busy.

`sparkserve stress` samples host memory from a process of its own (sparkserve.stress.sampler,
host_probe.py) so that the load it drives cannot slow the sampling. Per run: the sampler at
`--hz`, and this process holding the GIL in long C calls (allocating and filling 256 MiB
blocks, as building big prompts did) for `--seconds`; then the achieved rate (samples - 1
over their span), the longest gap between two samples, and the machine's load. Standard
library, psutil and sparkserve:

    PYTHONPATH=src python3 benchmarks/sampler_rate.py --runs 3 --hz 20 --json sampler.json

Prints a table and writes JSON; exit 1 when a run got fewer than two samples.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

from bench_record import record_runs

from sparkserve.stress.sampler import MemorySampler

COLUMNS = ("run", "requested_hz", "achieved_hz", "samples", "max_gap_s", "load_1m")


def run_once(number: int, hz: float, seconds: float, block_mib: int) -> dict[str, object]:
    sampler = MemorySampler(hz, nvidia_smi=None).start()
    sampler.phase("busy")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        blob = b"\x01" * (block_mib << 20)  # one C call: the GIL is held until it returns
        del blob
    samples = sampler.stop()
    span = samples[-1].t - samples[0].t if len(samples) > 1 else 0.0
    gaps = [b.t - a.t for a, b in itertools.pairwise(samples)]
    return {
        "run": number, "requested_hz": hz, "samples": len(samples),
        "achieved_hz": round((len(samples) - 1) / span, 2) if span > 0 else None,
        "max_gap_s": round(max(gaps), 3) if gaps else None,
        "load_1m": round(os.getloadavg()[0], 2),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hz", type=float, default=20.0, help="the sampler's rate")
    parser.add_argument("--seconds", type=float, default=2.0, help="busy for this long")
    parser.add_argument("--block-mib", type=int, default=256, help="one C call's allocation")
    parser.add_argument("--json", type=Path, help="write the runs here")
    args = parser.parse_args(argv)
    runs = record_runs(
        "sampler_rate",
        args,
        COLUMNS,
        (
            run_once(number, args.hz, args.seconds, args.block_mib)
            for number in range(1, args.runs + 1)
        ),
    )
    return 0 if all(int(str(run["samples"])) >= 2 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
