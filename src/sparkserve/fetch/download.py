"""Putting a start's checkpoints into the model cache, whole: what `sparkserve fetch` and a
launcher's start (sparkserve.start) run. The Hub's side is sparkserve.fetch.hub, the cache's
sparkserve.fetch.cache, the refusals without a download sparkserve.fetch.check."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

from sparkserve.fetch.cache import (
    Record,
    blob_bytes,
    free_bytes,
    incomplete,
    remove_broken,
    remove_stale_partials,
    repo_dir_of,
)
from sparkserve.fetch.check import (
    SPACE_MARGIN,
    check_local,
    check_one,
    no_space,
    offline_snapshot,
    refuse_incomplete_offline,
    unreachable_snapshot,
)
from sparkserve.fetch.hub import (
    FetchError,
    Revision,
    Unreachable,
    hub_refusal,
    revision_of,
)
from sparkserve.fetch.progress import Progress, human
from sparkserve.fetch.wanted import Wanted, is_local, wanted
from sparkserve.launch.settings import Settings

PROGRESS_EVERY_S = 10.0


def _download(item: Wanted, hub: Path, revision: Revision, prog: str) -> Path:
    """Fetch what the cache lacks of `revision`; finished files are kept on any failure."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import disable_progress_bars

    repo_dir = repo_dir_of(hub, item.ref)
    snapshot = repo_dir / "snapshots" / revision.sha
    missing = {
        name: size for name, size in revision.sizes.items() if not (snapshot / name).is_file()
    }
    needed = sum(missing.values())
    if needed and needed + SPACE_MARGIN > free_bytes(hub)[1]:
        raise FetchError(no_space(needed, hub))
    progress = None
    if missing and not sys.stderr.isatty():
        disable_progress_bars()
        label = f"{prog}: {item.knob} {item.ref}"
        progress = Progress(label, snapshot, repo_dir / "blobs", revision.sizes, PROGRESS_EVERY_S)
        progress.start()
    try:
        return Path(snapshot_download(item.ref, revision=revision.sha))
    except HfHubHTTPError as error:
        raise FetchError(hub_refusal(error)) from error
    except OSError as error:
        if error.errno == errno.ENOSPC:
            left = sum(s for n, s in revision.sizes.items() if not (snapshot / n).is_file())
            raise FetchError(
                "the disk filled during the download; " + no_space(left, hub)
            ) from error
        raise FetchError(f"download failed: {error}; start again to fetch the rest") from error
    except Exception as error:  # a connection cut: the transport's own error types
        first = str(error).splitlines()[0] if str(error) else ""
        raise FetchError(
            f"download failed ({type(error).__name__}: {first}); start again to fetch the rest"
        ) from error
    finally:
        if progress is not None:
            progress.stop()


def _check_weights(item: Wanted, snapshot: Path, repair: bool, prog: str) -> bool:
    """True when the snapshot is whole (cache.incomplete). What is not is removed when
    `repair` (the caller downloads it again), else refused in one line."""
    problems = incomplete(snapshot)
    if problems and not repair:
        refuse_incomplete_offline(snapshot)
    for bad in problems:
        remove_broken(bad)
        what = (
            f"is missing from the cache ({bad.problem}); downloading it"
            if bad.missing
            else f"in the cache is cut short or damaged ({bad.problem}); removed it, "
            "downloading it again"
        )
        print(f"{prog}: {item.knob} {item.ref}: {bad.path.name} {what}", file=sys.stderr)
    return not problems


def fetch_one(item: Wanted, hf_home: Path, offline: bool, record: Record, prog: str) -> str:
    """Put one checkpoint into the cache, whole; return the line that says what happened."""
    if is_local(item.ref):
        return check_local(item)
    try:
        return _fetch_repo(item, hf_home, offline, record, prog)
    except FetchError as error:
        raise FetchError(f"{item.knob}={item.ref}: {error}") from error


def _fetch_repo(item: Wanted, hf_home: Path, offline: bool, record: Record, prog: str) -> str:
    known = record.complete(item.ref)
    if known is not None and _check_weights(item, known, repair=not offline, prog=prog):
        return f"{item.knob} {item.ref}: complete in the cache ({known}), nothing to fetch"
    if offline:
        cached = offline_snapshot(item.ref)
        return f"{item.knob} {item.ref}: in the cache ({cached}), offline (HF_OFFLINE=1)"
    hub = hf_home / "hub"
    repo_dir = repo_dir_of(hub, item.ref)
    try:
        revision = revision_of(item.ref)
    except Unreachable as error:
        cached = unreachable_snapshot(item.ref, error)
        # Not recorded as complete: nobody could check it against the Hub.
        return f"{item.knob} {item.ref}: {error}; serving the cached snapshot as it is ({cached})"
    count, freed = remove_stale_partials(hub, repo_dir)
    if count:
        print(
            f"{prog}: {item.knob} {item.ref}: removed {count} partial file(s) a stopped fetch "
            f"left ({human(freed)})",
            file=sys.stderr,
        )
    present = repo_dir / "snapshots" / revision.sha
    if present.is_dir():  # what is there of this revision but not whole is fetched again
        _check_weights(item, present, repair=True, prog=prog)
    before = blob_bytes(repo_dir)
    snapshot = _download(item, hub, revision, prog)
    got = blob_bytes(repo_dir) - before
    broken = incomplete(snapshot)
    if broken:
        raise FetchError(
            f"after the download {broken[0].line()}: start again; if it stays so, the repo "
            "itself is not whole"
        )
    record.add(item.ref, snapshot)
    return f"{item.knob} {item.ref}: {got / 2**20:.1f} MiB downloaded, complete ({snapshot})"


def check_writable(hf_home: Path) -> None:
    """FetchError (one line) when the cache exists and this process cannot write it: the
    services run as a user that is not root (compose's CACHE_UID:CACHE_GID), and vLLM, the
    guard and the download all write there."""
    if not hf_home.is_dir() or os.access(hf_home, os.W_OK | os.X_OK):
        return
    owner = hf_home.stat()
    uid, gid = os.getuid(), os.getgid()
    if owner.st_uid == 0:  # a volume an earlier image, which ran as root, filled
        raise FetchError(
            f"HF_HOME={hf_home} is not writable by this user ({uid}:{gid}); it belongs to "
            f"root (an earlier sparkserve image ran as root): give it to {uid}:{gid} once, as root "
            "(docs/DOWNLOADS.md has the compose command)"
        )
    raise FetchError(
        f"HF_HOME={hf_home} is not writable by this user ({uid}:{gid}); it belongs to "
        f"{owner.st_uid}:{owner.st_gid}: set CACHE_UID={owner.st_uid} and "
        f"CACHE_GID={owner.st_gid} (compose runs every service as them), or give it to "
        f"{uid}:{gid}"
    )


def fetch_all(settings: Settings, prog: str, check: bool = False) -> None:
    """Every checkpoint of these settings put into the cache, whole (with `check`: every
    refusal that would make, nothing downloaded or removed), a line each on stderr; FetchError
    (its line names the knob) on the first that fails. Runs before anything imports
    huggingface_hub in this process, which reads HF_HOME and HF_HUB_OFFLINE when imported."""
    hf_home = Path(settings.values.HF_HOME)
    check_writable(hf_home)
    os.environ["HF_HOME"] = str(hf_home)
    os.environ["HF_HUB_OFFLINE"] = "1" if settings.values.HF_OFFLINE else "0"
    offline = settings.values.HF_OFFLINE
    record = Record(hf_home)
    for item in wanted(settings):
        if check:
            line = check_one(item, hf_home, offline, record)
        else:
            line = fetch_one(item, hf_home, offline, record, prog)
        print(f"{prog}: {line}", file=sys.stderr, flush=True)
