"""The memory guard's record of a stop, as a start reads it: after the guard stopped vLLM, a
start refuses (exit 3, before any model load) until a container created with GUARD_RESUME=1
starts. Only that container's first start may clear the record: it leaves a mark in the
container's own filesystem (SPARKSERVE_STATE_DIR), so a restart of the same container, with
the same environment, never clears a record written later."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

SPENT_MARK = "guard-resume-spent"


def state_dir(env: Mapping[str, str]) -> Path:
    """The container's own state folder (the image sets it), else a temporary folder."""
    return Path(env.get("SPARKSERVE_STATE_DIR") or env.get("TMPDIR") or "/tmp")


def refusal(record: Path, resume: bool, states: Path, prog: str, look: bool = False) -> str:
    """The start's one refusal line, or "" when it may go on. A start (not `look`, the strict
    dry run's: it changes nothing) with GUARD_RESUME=1 on a fresh container spends the resume
    and clears the record."""
    spent = states / SPENT_MARK
    if resume and not spent.exists():
        if look:
            return ""
        states.mkdir(parents=True, exist_ok=True)
        spent.touch()
        if record.is_file():
            print(
                f"{prog}: GUARD_RESUME=1: clearing the memory guard record {record} and starting",
                file=sys.stderr,
            )
            record.unlink()
        return ""
    if not record.is_file():
        return ""
    reason = record.read_text(errors="replace").replace("\n", "")
    if resume:
        return (
            f"{prog}: the memory guard stopped vLLM ({record}): {reason}; GUARD_RESUME=1 was "
            "spent on this container's first start: fix the cause (docs/MEMORY.md), then "
            "recreate the container (docker compose up -d --force-recreate)"
        )
    return (
        f"{prog}: the memory guard stopped vLLM last time ({record}): {reason}; fix the cause "
        "(docs/MEMORY.md), then start once with GUARD_RESUME=1"
    )
