"""`sparkserve fetch`: put the checkpoints a launcher will serve into the model cache first.

Runs before vLLM starts (the launchers' first step, and compose's *-fetch services), so a slow
download never counts against the server's healthcheck and vLLM itself can run offline. Uses
huggingface_hub's `snapshot_download`: its progress bars, resumed partial files, HF_TOKEN.
A checkpoint fetched completely once is recorded in the cache; later runs find it there and
make no network call. HF_OFFLINE=1 never contacts the Hub. A MODEL that is a local folder is
used as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkserve.knobs import LAUNCHERS, KnobError, Launcher
from sparkserve.settings import Settings, resolve_settings

EXIT_BAD_KNOB = 2
EXIT_FETCH_FAILED = 4
RECORD = Path("sparkserve") / "fetched.json"  # under HF_HOME


class FetchError(RuntimeError):
    """A checkpoint could not be put into the cache; the message is one line."""


@dataclass(frozen=True)
class Wanted:
    knob: str  # the knob naming it: MODEL or DRAFT_MODEL
    ref: str  # a Hugging Face repo id or a local folder


def wanted(settings: Settings) -> list[Wanted]:
    """The checkpoints the launcher's vLLM command will load with these settings."""
    return [Wanted(knob, ref) for knob, ref in settings.models()]


def is_local(ref: str) -> bool:
    return ref.startswith(("/", "./", "../")) or Path(ref).is_dir()


def _repo_dir(hub: Path, repo_id: str) -> Path:
    return hub / ("models--" + repo_id.replace("/", "--"))


def _blob_bytes(repo_dir: Path) -> int:
    blobs = repo_dir / "blobs"
    if not blobs.is_dir():
        return 0
    return sum(p.stat().st_size for p in blobs.iterdir() if p.is_file())


def _snapshot_files(snapshot: Path) -> list[str]:
    return sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())


class Record:
    """Which repos were fetched completely, and their files (HF_HOME/sparkserve/fetched.json)."""

    def __init__(self, hf_home: Path) -> None:
        self.path = hf_home / RECORD
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            data = {}
        self.entries: dict[str, dict] = data if isinstance(data, dict) else {}

    def complete(self, repo_id: str) -> Path | None:
        """The recorded snapshot, when every recorded file of it is still there."""
        entry = self.entries.get(repo_id)
        if not isinstance(entry, dict) or not isinstance(entry.get("files"), list):
            return None
        snapshot = Path(str(entry.get("snapshot", "")))
        files = entry["files"]
        if files and all((snapshot / name).is_file() for name in files):
            return snapshot
        return None

    def add(self, repo_id: str, snapshot: Path) -> None:
        self.entries[repo_id] = {"snapshot": str(snapshot), "files": _snapshot_files(snapshot)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps(self.entries, indent=1, sort_keys=True) + "\n")
        partial.replace(self.path)


class Unreachable(FetchError):
    """The Hub could not be asked (no network, a proxy, an outage)."""


def _cached(repo_id: str) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        return None


def _download(repo_id: str) -> Path:
    """The repo's current revision, complete: asks the Hub which files it has, then fetches
    the missing ones (partial files resume)."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        revision = HfApi().model_info(repo_id).sha
    except HfHubHTTPError as error:
        status = getattr(error.response, "status_code", "?")
        hint = " (gated or private: set HF_TOKEN)" if status in (401, 403) else ""
        raise FetchError(f"the Hub answered HTTP {status}{hint}") from error
    except Exception as error:  # the transport's error types change between releases
        raise Unreachable(f"the Hub is unreachable ({type(error).__name__})") from error
    try:
        return Path(snapshot_download(repo_id, revision=revision))
    except HfHubHTTPError as error:
        raise FetchError(f"download failed: {str(error).splitlines()[0]}") from error
    except OSError as error:
        raise FetchError(f"download failed: {error}") from error


def fetch_one(item: Wanted, hf_home: Path, offline: bool, record: Record) -> str:
    """Put one checkpoint into the cache; return the line that says what happened."""
    if is_local(item.ref):
        if not Path(item.ref).is_dir():
            raise FetchError(f"{item.knob}={item.ref!r}: no such folder")
        return f"{item.knob} {item.ref}: a local folder, nothing to fetch"
    known = record.complete(item.ref)
    if known is not None:
        return f"{item.knob} {item.ref}: complete in the cache ({known}), nothing to fetch"
    if offline:
        cached = _cached(item.ref)
        if cached is None:
            raise FetchError(f"{item.knob}={item.ref}: HF_OFFLINE=1 and it is not in the cache")
        return f"{item.knob} {item.ref}: in the cache ({cached}), offline (HF_OFFLINE=1)"
    repo_dir = _repo_dir(hf_home / "hub", item.ref)
    before = _blob_bytes(repo_dir)
    try:
        snapshot = _download(item.ref)
    except Unreachable as error:
        cached = _cached(item.ref)
        if cached is None:
            raise FetchError(
                f"{item.knob}={item.ref}: {error} and it is not in the cache"
            ) from error
        # Not recorded as complete: nobody could check it against the Hub.
        return f"{item.knob} {item.ref}: {error}; serving the cached snapshot as it is ({cached})"
    except FetchError as error:
        raise FetchError(f"{item.knob}={item.ref}: {error}") from error
    got = _blob_bytes(repo_dir) - before
    record.add(item.ref, snapshot)
    return f"{item.knob} {item.ref}: {got / 2**20:.1f} MiB downloaded, complete ({snapshot})"


def run_fetch(env: Mapping[str, str], launcher: Launcher, prog: str) -> int:
    try:
        settings = resolve_settings(env, launcher)
    except KnobError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_BAD_KNOB
    hf_home = Path(settings["HF_HOME"])
    # huggingface_hub reads HF_HOME (and HF_TOKEN) from the environment.
    os.environ["HF_HOME"] = str(hf_home)
    offline = settings.flag("HF_OFFLINE")
    record = Record(hf_home)
    for item in wanted(settings):
        try:
            line = fetch_one(item, hf_home, offline, record)
        except FetchError as error:
            print(f"{prog}: {error}", file=sys.stderr)
            return EXIT_FETCH_FAILED
        print(f"{prog}: {line}", file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> int:
    return run_fetch(os.environ, args.launcher, args.prog)


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "fetch", help="download the checkpoints a launcher will serve into the model cache"
    )
    parser.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="dflash",
        help="whose checkpoints: dflash (target and drafter) or mtp (target)",
    )
    parser.add_argument("--prog", default="sparkserve fetch", help="name to put on log lines")
    parser.set_defaults(run=_run)
