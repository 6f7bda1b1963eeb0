"""The patch engine (sparkserve.patching.engine) on a synthetic patch and synthetic sources:
classification, apply, idempotence, exact revert, loud refusal of unknown code and of corrupt
marker regions, the patch's own mistakes caught before a write, and file reads and atomic
writes that never leave a half-written file."""

from __future__ import annotations

import ast
import os
import resource
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkserve.patching import PREFIX_ALIGN, State
from sparkserve.patching.engine import (
    ORIGINAL_PREFIX,
    Finding,
    LineSpan,
    Patch,
    PatchError,
    PatchInfo,
    diff,
    read_source,
    write_atomically,
)


class MaxPatch(Patch):
    """Turns `return a + b` in the top-level `limit()` into `return max(a, b)`."""

    info = PatchInfo(
        name="toy-max",
        target="pkg/limits.py",
        description="limit(): the larger of a and b, not their sum.",
        why="a synthetic patch for the engine's tests",
        upstream="none",
        affected="1.0 - 1.2",
        fixed_in="1.3",
    )

    def __init__(self, replacement: list[str] | None = None) -> None:
        self.replacement = replacement  # lines to put in the span; None: the right ones

    def inspect(self, source: str) -> tuple[Finding, LineSpan | None]:
        try:
            tree = ast.parse(source)
        except SyntaxError as error:
            return Finding(State.UNRECOGNISED, f"does not parse: {error}"), None
        functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "limit"]
        if len(functions) != 1 or not isinstance(functions[0].body[-1], ast.Return):
            return Finding(State.UNRECOGNISED, "expected one limit() ending in a return"), None
        returned = functions[0].body[-1]
        found = ast.unparse(returned.value) if returned.value else ""
        if found == "max(a, b)":
            return Finding(State.FIXED_UPSTREAM, "limit() returns max(a, b)"), None
        if found != "a + b":
            return Finding(State.UNRECOGNISED, f"expected 'return a + b', found {found!r}"), None
        start, end = returned.lineno - 1, returned.end_lineno or returned.lineno
        first = source.splitlines(keepends=True)[start]
        indent = first[: len(first) - len(first.lstrip(" \t"))]
        newline = "\r\n" if first.endswith("\r\n") else "\n"
        new_lines = self.replacement or [f"{indent}return max(a, b){newline}"]
        return Finding(State.NEEDED, f"limit() lines {start + 1}-{end} add"), LineSpan(
            start, end, new_lines
        )


PATCH = MaxPatch()
BEGIN = "# >>> sparkserve patch toy-max (docs/PATCHES.md); original lines:"
END = "# <<< sparkserve patch toy-max"

SOURCE = '''"""Limits."""


def limit(a, b):
    total = 0
    return (
        a + b
    )


def other():
    return 1
'''

PATCHED = f'''"""Limits."""


def limit(a, b):
    total = 0
    {BEGIN}
    # |     return (
    # |         a + b
    # |     )
    return max(a, b)
    {END}


def other():
    return 1
'''

# Sources whose bytes must survive apply + revert: CRLF endings, tabs, no final newline
# after the patched lines, an empty line inside the replaced span.
ROUND_TRIP_SOURCES = {
    "lf": SOURCE,
    "crlf": SOURCE.replace("\n", "\r\n"),
    "tabs": "def limit(a, b):\n\tif a:\n\t\tpass\n\treturn a + b\n",
    "no-final-newline": "def limit(a, b):\n    return a + b\n\nx = 1",
    "patched-lines-end-the-file": "def limit(a, b):\n    return a + b",
    "patched-lines-end-the-file-crlf": "x = 1\r\ndef limit(a, b):\r\n    return a + b",
    "blank-line-in-span": "def limit(a, b):\n    return (\n\n        a + b)\n",
}


def run(source: str) -> dict[str, int]:
    """What the module's limit(2, 3) and other() return."""
    namespace: dict[str, object] = {}
    exec(compile(source, "<patched>", "exec"), namespace)
    results = {"limit": namespace["limit"](2, 3)}  # type: ignore[operator]
    if "other" in namespace:
        results["other"] = namespace["other"]()  # type: ignore[operator]
    return results


def one_line(error: pytest.ExceptionInfo[PatchError]) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


def test_buggy_source_is_needed_with_the_span_of_its_lines() -> None:
    finding, span = PATCH.classify(SOURCE)
    assert finding.state is State.NEEDED
    assert finding.detail == "limit() lines 6-8 add"
    assert span == LineSpan(5, 8, ["    return max(a, b)\n"])


def test_apply_keeps_the_replaced_lines_as_comments_between_markers() -> None:
    patched = PATCH.apply_source(SOURCE)
    assert patched == PATCHED
    assert PATCH.begin_marker() == BEGIN and PATCH.end_marker() == END
    assert run(SOURCE) == {"limit": 5, "other": 1}
    assert run(patched) == {"limit": 3, "other": 1}


def test_a_patched_source_is_applied_and_applying_again_is_refused() -> None:
    finding, span = PATCH.classify(PATCHED)
    assert finding == Finding(State.APPLIED, "marker '<<< sparkserve patch toy-max' present")
    assert span is None
    with pytest.raises(PatchError) as error:
        PATCH.apply_source(PATCHED)
    assert one_line(error) == (
        "cannot apply toy-max: already applied: marker '<<< sparkserve patch toy-max' present"
    )


@pytest.mark.parametrize("name", ROUND_TRIP_SOURCES)
def test_revert_restores_the_original_bytes(name: str) -> None:
    source = ROUND_TRIP_SOURCES[name]
    patched = PATCH.apply_source(source)
    assert patched != source
    assert PATCH.classify(patched)[0].state is State.APPLIED
    assert run(patched)["limit"] == 3
    assert PATCH.revert_source(patched) == source
    assert PATCH.classify(source)[0].state is State.NEEDED


def test_region_is_indented_like_the_first_replaced_line() -> None:
    patched = PATCH.apply_source(ROUND_TRIP_SOURCES["tabs"])
    region = patched.splitlines()[3:6]
    assert region == [f"\t{BEGIN}", f"\t{ORIGINAL_PREFIX}\treturn a + b", "\treturn max(a, b)"]
    assert patched.splitlines()[6] == f"\t{END}"


def test_fixed_upstream_is_reported_and_not_applied() -> None:
    fixed = SOURCE.replace("a + b", "max(a, b)")
    assert PATCH.classify(fixed) == (
        Finding(State.FIXED_UPSTREAM, "limit() returns max(a, b)"),
        None,
    )
    with pytest.raises(PatchError) as error:
        PATCH.apply_source(fixed)
    assert one_line(error) == "cannot apply toy-max: fixed upstream: limit() returns max(a, b)"


@pytest.mark.parametrize(
    ("source", "detail"),
    [
        (SOURCE.replace("a + b", "a - b"), "expected 'return a + b', found 'a - b'"),
        (SOURCE.replace("def limit", "def cap"), "expected one limit() ending in a return"),
        (SOURCE + SOURCE, "expected one limit() ending in a return"),
        (SOURCE.replace("    )\n", ""), "does not parse: "),
    ],
    ids=["changed-code", "renamed", "twice", "syntax-error"],
)
def test_unrecognised_code_fails_loudly_and_the_file_is_untouched(
    tmp_path: Path, source: str, detail: str
) -> None:
    path = tmp_path / "limits.py"
    path.write_text(source)
    before = path.stat()
    finding, span = PATCH.classify(read_source(path))
    assert finding.state is State.UNRECOGNISED and detail in finding.detail
    assert span is None
    with pytest.raises(PatchError) as error:
        write_atomically(path, PATCH.apply_source(read_source(path)))
    assert one_line(error).startswith(f"cannot apply toy-max: unrecognised: {detail}")
    assert path.read_text() == source
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    assert os.listdir(tmp_path) == ["limits.py"]


@pytest.mark.parametrize(
    ("patched", "expected"),
    [
        (
            PATCHED.replace(f"    {END}\n", ""),
            "expected one begin and one end marker, found 1 and 0",
        ),
        (PATCHED + PATCHED, "expected one begin and one end marker, found 2 and 2"),
        (  # the end marker above the begin marker
            PATCHED.replace(BEGIN, "@@").replace(END, BEGIN).replace("@@", END),
            "expected one begin and one end marker, found 1 and 1",
        ),
        (
            PATCHED.replace(ORIGINAL_PREFIX, "# "),
            "the marked region holds no original lines",
        ),
    ],
    ids=["no-end", "twice", "reversed", "no-originals"],
)
def test_a_corrupt_marker_region_is_unrecognised_and_not_reverted(
    patched: str, expected: str
) -> None:
    finding, span = PATCH.classify(patched)
    assert finding == Finding(State.UNRECOGNISED, f"patch toy-max: {expected}")
    assert span is None
    with pytest.raises(PatchError) as error:
        PATCH.revert_source(patched)
    assert one_line(error) == f"patch toy-max: {expected}"
    with pytest.raises(PatchError, match=r"^cannot apply toy-max: unrecognised: patch toy-max: "):
        PATCH.apply_source(patched)


def test_corrupted_marker_region_is_unrecognised() -> None:
    source = "def f():\n    x = 1\n"
    broken = f"def f():\n    {PREFIX_ALIGN.begin_marker()}\n    x = 2\n"
    assert PREFIX_ALIGN.classify(source)[0].state is State.UNRECOGNISED
    finding, _ = PREFIX_ALIGN.classify(broken)
    assert finding.state is State.UNRECOGNISED
    assert "one begin and one end marker" in finding.detail


def test_revert_of_a_source_without_markers_is_refused() -> None:
    with pytest.raises(PatchError) as error:
        PATCH.revert_source(SOURCE)
    assert one_line(error) == (
        "patch toy-max: expected one begin and one end marker, found 0 and 0"
    )


@pytest.mark.parametrize(
    ("replacement", "expected"),
    [
        (["    return max(a,\n"], r"^internal error: toy-max gives invalid Python: "),
        (
            [f"    {ORIGINAL_PREFIX}stray\n", "    return max(a, b)\n"],
            r"^internal error: toy-max would not revert to the original$",
        ),
    ],
    ids=["invalid-python", "no-round-trip"],
)
def test_a_patch_that_would_break_the_file_is_refused(
    replacement: list[str], expected: str
) -> None:
    with pytest.raises(PatchError, match=expected) as error:
        MaxPatch(replacement).apply_source(SOURCE)
    one_line(error)


def test_diff_names_both_sides_and_shows_the_change() -> None:
    text = diff(Path("vllm") / PATCH.info.target, SOURCE, PATCHED)
    lines = text.splitlines()
    assert lines[:2] == ["--- a/vllm/pkg/limits.py", "+++ b/vllm/pkg/limits.py"]
    assert "-    return (" in lines and f"+    {BEGIN}" in lines and f"+    {END}" in lines
    assert diff(Path("x.py"), SOURCE, SOURCE) == ""


def test_read_source_keeps_crlf(tmp_path: Path) -> None:
    path = tmp_path / "limits.py"
    path.write_bytes(b"x = 1\r\ny = 2\n")
    assert read_source(path) == "x = 1\r\ny = 2\n"


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (lambda path: None, "No such file or directory"),
        (lambda path: path.mkdir(), "Is a directory"),
        (lambda path: path.write_bytes(b"x = '\xff'\n"), "not UTF-8 (invalid start byte)"),
    ],
    ids=["missing", "directory", "latin-1"],
)
def test_read_source_errors_name_the_file(
    tmp_path: Path, setup: Callable[[Path], object], reason: str
) -> None:
    path = tmp_path / "limits.py"
    setup(path)
    with pytest.raises(PatchError) as error:
        read_source(path)
    assert one_line(error) == f"cannot read {path}: {reason}"


def test_apply_and_revert_through_files_keep_bytes_and_mode(tmp_path: Path) -> None:
    path = tmp_path / "limits.py"
    original = ROUND_TRIP_SOURCES["crlf"].encode()
    path.write_bytes(original)
    path.chmod(0o640)
    write_atomically(path, PATCH.apply_source(read_source(path)))
    assert PATCH.classify(read_source(path))[0].state is State.APPLIED
    assert b"\r\n" in path.read_bytes()  # written with the text's own line endings
    assert path.stat().st_mode & 0o7777 == 0o640
    write_atomically(path, PATCH.revert_source(read_source(path)))
    assert path.read_bytes() == original
    assert path.stat().st_mode & 0o7777 == 0o640
    assert os.listdir(tmp_path) == ["limits.py"]


def test_a_write_that_fails_midway_leaves_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "limits.py"
    path.write_text(SOURCE)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # Files may not grow past 1 KiB (Python ignores SIGXFSZ: the write fails with EFBIG).
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
    try:
        with pytest.raises(PatchError) as error:
            write_atomically(path, PATCHED * 100)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert one_line(error) == f"cannot write {path}: File too large"
    assert path.read_text() == SOURCE
    assert os.listdir(tmp_path) == ["limits.py"]


def test_a_rename_that_fails_removes_the_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "limits.py"
    path.mkdir()  # os.replace cannot put a file over a directory
    with pytest.raises(PatchError) as error:
        write_atomically(path, PATCHED)
    assert one_line(error) == f"cannot write {path}: Is a directory"
    assert path.is_dir() and not list(path.iterdir())
    assert os.listdir(tmp_path) == ["limits.py"]


def test_a_temporary_file_that_cannot_be_made_names_the_directory(tmp_path: Path) -> None:
    path = tmp_path / f"{'x' * 250}.py"  # the temporary file's name would pass 255 bytes
    path.write_text(SOURCE)
    with pytest.raises(PatchError) as error:
        write_atomically(path, PATCHED)
    assert one_line(error) == (
        f"cannot write {path}: File name too long in {tmp_path} "
        "(run as the owner of the vLLM install, or at image build time)"
    )
    assert path.read_text() == SOURCE


def test_a_file_that_is_gone_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "limits.py"
    with pytest.raises(PatchError) as error:
        write_atomically(path, PATCHED)
    assert one_line(error) == f"cannot write {path}: No such file or directory"
    assert os.listdir(tmp_path) == []


def test_text_that_is_not_utf8_leaves_the_file_and_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "limits.py"
    path.write_text(SOURCE)
    with pytest.raises(PatchError) as error:
        write_atomically(path, PATCHED + "\udcff\n")  # a lone surrogate has no UTF-8 form
    assert one_line(error) == f"cannot write {path}: not UTF-8 (surrogates not allowed)"
    assert path.read_text() == SOURCE
    assert os.listdir(tmp_path) == ["limits.py"]
