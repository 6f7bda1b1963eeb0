"""A small engine for idempotent, reversible source patches to an installed vLLM.

A patch replaces one contiguous run of lines in one file. The replaced lines are kept,
verbatim, as comments inside the patched region, between two marker lines, so that the
patched file alone says what was changed and `revert` restores the original bytes without
a backup file. Each patch decides from the file's code (never from the version string
alone) whether the file has the bug, the upstream fix, our patch, or something unknown.
"""

from __future__ import annotations

import ast
import difflib
import enum
import os
import re
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

ORIGINAL_PREFIX = "# | "


class State(enum.Enum):
    NEEDED = "needed"
    APPLIED = "already applied"
    FIXED_UPSTREAM = "fixed upstream"
    UNRECOGNISED = "unrecognised"


@dataclass(frozen=True)
class PatchInfo:
    """DEP-3 style header: what the patch is, why, and where upstream stands."""

    name: str
    target: str  # path inside the vllm package, e.g. "v1/core/kv_cache_utils.py"
    description: str
    why: str
    upstream: str  # issue or pull request that tracks the bug upstream
    affected: str  # releases that have the bug, e.g. "0.23.0 - 0.27.x"
    fixed_in: str  # first release with the upstream fix
    # where releases before a move keep the same function (used when `target` is absent)
    former_target: str | None = None


@dataclass(frozen=True)
class Finding:
    state: State
    detail: str  # one line: what was found, or what was expected and not found


@dataclass(frozen=True)
class LineSpan:
    """Lines [start, end) of a file, 0-based, to be replaced by `new_lines`."""

    start: int
    end: int
    new_lines: list[str]


def statement_lines(source: str, start: int, end: int) -> tuple[str, list[str]]:
    """Lines [start, end) of `source`, 0-based, each ending in a newline, and the first one's
    indent: what a patch keeps of the statements it replaces, at their indent."""
    lines = source.splitlines(keepends=True)
    indent = lines[start][: len(lines[start]) - len(lines[start].lstrip(" \t"))]
    kept = lines[start:end]
    if not kept[-1].endswith(("\n", "\r")):
        kept[-1] += "\n"
    return indent, kept


class PatchError(Exception):
    """The patch cannot be applied or reverted; the message is one line for the user."""


class Patch(ABC):
    info: PatchInfo

    @abstractmethod
    def inspect(self, source: str) -> tuple[Finding, LineSpan | None]:
        """Classify an unpatched source; for NEEDED also return the lines to replace."""

    def one_function(self, source: str, name: str) -> ast.FunctionDef | Finding:
        """The target file's one top-level `def name`, or the UNRECOGNISED finding saying why
        there is none to inspect (the file does not parse, or has no or several such defs)."""
        try:
            tree = ast.parse(source)
        except SyntaxError as error:
            return Finding(State.UNRECOGNISED, f"{self.info.target} does not parse: {error}")
        functions = [
            node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name
        ]
        if len(functions) != 1:
            return Finding(State.UNRECOGNISED, f"expected one {name}() in {self.info.target}")
        return functions[0]

    def begin_marker(self) -> str:
        return f"# >>> sparkserve patch {self.info.name} (docs/PATCHES.md); original lines:"

    def end_marker(self) -> str:
        return f"# <<< sparkserve patch {self.info.name}"

    # The engine's half: markers, idempotence and revert are the same for every patch.

    def classify(self, source: str) -> tuple[Finding, LineSpan | None]:
        if self.begin_marker() in source:
            try:
                self.revert_source(source)
            except PatchError as error:
                return Finding(State.UNRECOGNISED, str(error)), None
            return Finding(State.APPLIED, f"marker '{self.end_marker()[2:]}' present"), None
        return self.inspect(source)

    def apply_source(self, source: str) -> str:
        finding, span = self.classify(source)
        if finding.state is not State.NEEDED or span is None:
            raise PatchError(
                f"cannot apply {self.info.name}: {finding.state.value}: {finding.detail}"
            )
        lines = source.splitlines(keepends=True)
        indent = re.match(r"[ \t]*", lines[span.start]).group(0)  # type: ignore[union-attr]
        replaced = lines[span.start : span.end]
        # The file's last line without a final newline: its comment gets one, the end marker
        # goes without (and revert takes it off again), so the bytes round-trip.
        open_end = not replaced[-1].endswith(("\n", "\r"))
        if open_end:
            replaced[-1] += "\n"
        region = [f"{indent}{self.begin_marker()}\n"]
        region += [f"{indent}{ORIGINAL_PREFIX}{line}" for line in replaced]
        region += span.new_lines
        region.append(f"{indent}{self.end_marker()}" + ("" if open_end else "\n"))
        patched = "".join(lines[: span.start] + region + lines[span.end :])
        try:
            compile(patched, self.info.target, "exec")
        except SyntaxError as error:
            raise PatchError(
                f"internal error: {self.info.name} gives invalid Python: {error}"
            ) from error
        if self.revert_source(patched) != source:  # the region must round-trip exactly
            raise PatchError(f"internal error: {self.info.name} would not revert to the original")
        return patched

    def revert_source(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        begins = [i for i, line in enumerate(lines) if line.strip() == self.begin_marker()]
        ends = [i for i, line in enumerate(lines) if line.strip() == self.end_marker()]
        if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
            raise PatchError(
                f"patch {self.info.name}: expected one begin and one end marker, "
                f"found {len(begins)} and {len(ends)}"
            )
        original: list[str] = []
        for line in lines[begins[0] + 1 : ends[0]]:
            stripped = line.lstrip(" \t")
            if stripped.startswith(ORIGINAL_PREFIX):
                original.append(stripped[len(ORIGINAL_PREFIX) :])
        if not original:
            raise PatchError(f"patch {self.info.name}: the marked region holds no original lines")
        end_marker = lines[ends[0]]
        if not end_marker.endswith(("\n", "\r")) and original[-1].endswith("\n"):
            original[-1] = original[-1][:-1]  # the file ended on the replaced lines, unterminated
        return "".join(lines[: begins[0]] + original + lines[ends[0] + 1 :])


def diff(path: Path, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )


def read_source(path: Path) -> str:
    """The file's text with its line endings untouched (read_text would fold CRLF)."""
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as error:
        raise PatchError(f"cannot read {path}: {error.strerror}") from error
    except UnicodeDecodeError as error:
        raise PatchError(f"cannot read {path}: not UTF-8 ({error.reason})") from error


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` in one rename, keeping its mode; never a half-written file."""
    try:
        mode = path.stat().st_mode & 0o7777
    except OSError as error:
        raise PatchError(f"cannot write {path}: {error.strerror}") from error
    try:
        handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed below, then renamed)
            "w",
            encoding="utf-8",
            newline="",  # write the text's own line endings: bytes in, same bytes out
            dir=path.parent,
            prefix=f".{path.name}.",
            suffix=".tmp",
            delete=False,
        )
    except OSError as error:
        raise PatchError(
            f"cannot write {path}: {error.strerror} in {path.parent} "
            "(run as the owner of the vLLM install, or at image build time)"
        ) from error
    try:
        with handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(handle.name, mode)
        os.replace(handle.name, path)
    except (OSError, UnicodeEncodeError) as error:
        Path(handle.name).unlink(missing_ok=True)
        why = error.strerror if isinstance(error, OSError) else f"not UTF-8 ({error.reason})"
        raise PatchError(f"cannot write {path}: {why}") from error
