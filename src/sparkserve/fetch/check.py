"""`sparkserve fetch --check`: every refusal a fetch would make, without downloading or
changing anything: each checkpoint found whole (every file its index lists, at the size its
own header gives) in the cache or a local folder, or else the Hub asked for the revision (so a
wrong name, a gated repo or a missing token refuses now) and the cache's disk measured against
what is missing. The launcher's strict dry run (DRY_RUN=strict, what scripts/up.sh runs before
Compose touches the running server) runs it in place of the fetch.
"""

from __future__ import annotations

from pathlib import Path

from sparkserve.fetch.cache import Record, free_bytes, incomplete, repo_dir_of
from sparkserve.fetch.hub import FetchError, Unreachable, cached_snapshot, revision_of
from sparkserve.fetch.progress import human
from sparkserve.fetch.wanted import Wanted, is_local

# Room beyond the files' own sizes: filesystem blocks, the cache's refs, locks and record.
SPACE_MARGIN = 2**20


def no_space(needed: int, hub: Path) -> str:
    where, free = free_bytes(hub)
    return (
        f"needs {human(needed + SPACE_MARGIN)} free in {where} for the files still missing, "
        f"and it has {human(free)}: free space there or put HF_HOME on a larger disk "
        "(compose: MODEL_CACHE), then start again"
    )


OFFLINE_REMEDY = "start once with HF_OFFLINE=0 to fetch it anew (or delete it)"
OFFLINE_MISSING_REMEDY = "start once with HF_OFFLINE=0 to fetch it"
UNREACHABLE_REMEDY = "start again once the Hub can be reached, to fetch it"


def refuse_incomplete(snapshot: Path, remedy: str, missing_remedy: str | None = None) -> None:
    """FetchError naming the first thing that keeps the snapshot from being whole, and what to
    do (`missing_remedy` where that thing is a file not there at all)."""
    problems = incomplete(snapshot)
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        todo = missing_remedy if first.missing and missing_remedy else remedy
        raise FetchError(f"{first.line()}{more}: {todo}")


def refuse_incomplete_offline(snapshot: Path) -> None:
    refuse_incomplete(snapshot, OFFLINE_REMEDY, OFFLINE_MISSING_REMEDY)


def check_one(item: Wanted, hf_home: Path, offline: bool, record: Record) -> str:
    """The line a fetch of `item` would end with, when it would succeed: what is in the cache,
    or what it would download; FetchError with the fetch's own refusal otherwise."""
    if is_local(item.ref):
        return check_local(item)
    try:
        return _check_repo(item, hf_home, offline, record)
    except FetchError as error:
        raise FetchError(f"{item.knob}={item.ref}: {error}") from error


def check_local(item: Wanted) -> str:
    """A local folder is served as it is: it must be there, and whole."""
    if not Path(item.ref).is_dir():
        raise FetchError(f"{item.knob}={item.ref!r}: no such folder")
    try:
        refuse_incomplete(Path(item.ref), "a local folder is served as it is: complete it")
    except FetchError as error:
        raise FetchError(f"{item.knob}={item.ref}: {error}") from error
    return f"{item.knob} {item.ref}: a local folder, nothing to fetch"


def offline_snapshot(ref: str) -> Path:
    """HF_OFFLINE=1: the cached snapshot, whole; FetchError otherwise."""
    cached = cached_snapshot(ref)
    if cached is None:
        raise FetchError("HF_OFFLINE=1 and it is not in the cache")
    refuse_incomplete_offline(cached)
    return cached


def unreachable_snapshot(ref: str, error: Unreachable) -> Path:
    """The Hub cannot be asked: the cached snapshot, whole; FetchError otherwise."""
    cached = cached_snapshot(ref)
    if cached is None:
        raise FetchError(f"{error} and it is not in the cache") from error
    refuse_incomplete(cached, UNREACHABLE_REMEDY)
    return cached


def _check_repo(item: Wanted, hf_home: Path, offline: bool, record: Record) -> str:
    known = record.complete(item.ref)
    if known is not None and not incomplete(known):
        return f"{item.knob} {item.ref}: complete in the cache ({known})"
    if offline:
        cached = offline_snapshot(item.ref)
        return f"{item.knob} {item.ref}: in the cache ({cached}), offline (HF_OFFLINE=1)"
    try:
        revision = revision_of(item.ref)
    except Unreachable as error:
        cached = unreachable_snapshot(item.ref, error)
        return f"{item.knob} {item.ref}: {error}; the cached snapshot is whole ({cached})"
    hub = hf_home / "hub"
    snapshot = repo_dir_of(hub, item.ref) / "snapshots" / revision.sha
    missing = {n: s for n, s in revision.sizes.items() if not (snapshot / n).is_file()}
    needed = sum(missing.values())
    if needed and needed + SPACE_MARGIN > free_bytes(hub)[1]:
        raise FetchError(no_space(needed, hub))
    if not missing:
        return f"{item.knob} {item.ref}: the Hub's revision {revision.sha[:12]} is in the cache"
    return (
        f"{item.knob} {item.ref}: {len(missing)} file(s) of revision {revision.sha[:12]} to "
        f"download ({human(needed)}); the disk has room"
    )
