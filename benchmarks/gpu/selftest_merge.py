"""Cases of `sparkserve selftest` run in different calls, compared as one run would.

The H200 of the device tool runs a command for 600 s at most, and a cold start of the Spark
geometry takes about 300 s of it, so benchmarks/gpu/h200.sh runs the selftest's cases over
several calls, each bringing back a selftest.tgz. This reads them (in order; a case run again
replaces the earlier), adds the greedy comparisons `sparkserve selftest` makes across its
cases, and writes one selftest.json and the table.

    python3 benchmarks/gpu/selftest_merge.py --out DIR A/selftest.tgz B/selftest.tgz ...
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

from sparkserve.client import checks, run


def read_run(path: Path) -> dict:
    with tarfile.open(path) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith("/selftest.json"))
        handle = archive.extractfile(member)
        if handle is None:
            raise SystemExit(f"selftest_merge: {path}: selftest.json is not a file")
        return json.load(io.TextIOWrapper(handle))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="selftest.tgz files, in order")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    documents = [read_run(path) for path in args.runs]
    shape = {key: documents[0][key] for key in ("geometry", "layers", "vocab", "cuda")}
    for path, document in zip(args.runs, documents, strict=True):
        if {key: document[key] for key in shape} != shape:
            raise SystemExit(f"selftest_merge: {path}: another geometry than {shape}")
    results: dict[str, list[checks.Result]] = {}
    for document in documents:
        for case, rows in document["cases"].items():
            results[case] = [checks.Result(**row) for row in rows]
    for case, result in run.compare(results).items():
        results[case] = [r for r in results[case] if r.name != result.name] + [result]
    merged = {**documents[0], "cases": {c: [vars(r) for r in rs] for c, rs in results.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "selftest.json").write_text(json.dumps(merged, indent=1, default=str) + "\n")
    print(run.table(results))
    failed = run.failed_checks(results)
    print(f"failed: {'; '.join(failed) or 'none'}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
