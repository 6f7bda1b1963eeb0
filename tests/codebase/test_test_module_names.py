"""pytest imports the test modules by their file name (rootdir-relative, no packages): two
modules of one name in different folders stop the whole run's collection with 'import file
mismatch', and the next release's run with it, which collects everything."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_file_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if "cpu_shims" not in path.parts:
            by_name[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"test modules sharing a file name (rename one): {shared}"
