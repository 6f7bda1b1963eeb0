"""`sparkserve fetch`: put the checkpoints a launcher will serve into the model cache first.

Runs before vLLM starts (the launchers' first step, and compose's *-fetch services), so a slow
download never counts against the server's healthcheck and vLLM itself can run offline. Uses
huggingface_hub's `snapshot_download` and HF_TOKEN. Before downloading it asks the Hub for the
revision's file list and sizes, removes partial files a stopped fetch left, and refuses when
the cache's disk cannot hold what is missing. Files finished by an earlier run are kept; a
file cut short is fetched again from its start (huggingface_hub 2.x does not resume inside a
file). Progress: huggingface_hub's bars on a terminal, else a line per finished file and at
least every PROGRESS_EVERY_S seconds (what `docker compose logs` shows).

A checkpoint fetched completely once is recorded in the cache; later runs find it there and
make no network call. Every run checks each safetensors file's length against its own header
before vLLM starts: a file cut short in the cache is removed and fetched again (online), or
refused in one line (HF_OFFLINE=1). HF_OFFLINE=1 never contacts the Hub. A MODEL that is a
local folder is used as it is.

Exit status: 0 every checkpoint is in the cache and whole; 2 a bad knob; 4 a checkpoint could
not be fetched or checked (the Hub's answer, a full disk, a file cut short). Each failure is one
line on stderr naming the knob, the repo and what to do.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkserve.fetch.cache import (
    broken_weights,
    free_bytes,
    remove_broken,
    remove_stale_partials,
)
from sparkserve.fetch.progress import Progress, human
from sparkserve.knobs.registry import LAUNCHERS, KnobError, Launcher
from sparkserve.launch.launch_plan import LaunchPlan
from sparkserve.launch.settings import Settings, resolve_settings

EXIT_BAD_KNOB = 2
EXIT_FETCH_FAILED = 4
RECORD = Path("sparkserve") / "fetched.json"  # under HF_HOME
PROGRESS_EVERY_S = 10.0
# Room beyond the files' own sizes: filesystem blocks, the cache's refs, locks and record.
SPACE_MARGIN = 2**20


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
        """Record the snapshot complete; on a disk too full for the record, leave it
        unrecorded (the next run asks the Hub again) and no partial record behind."""
        self.entries[repo_id] = {"snapshot": str(snapshot), "files": _snapshot_files(snapshot)}
        partial = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(self.entries, indent=1, sort_keys=True) + "\n")
            partial.replace(self.path)
        except OSError:
            partial.unlink(missing_ok=True)


class Unreachable(FetchError):
    """The Hub could not be asked (no network, a proxy, an outage)."""


def _cached(repo_id: str) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        return None


def _has_token() -> bool:
    from huggingface_hub import get_token

    return bool(get_token())


def hub_refusal(error: Exception) -> str:
    """The Hub's refusal in one line, with what to do about it (never the token itself)."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    status = getattr(getattr(error, "response", None), "status_code", "?")
    token = _has_token()
    if isinstance(error, GatedRepoError):
        if token:
            return (
                f"the repo is gated and the token in HF_TOKEN has no access (HTTP {status}): "
                "accept its terms on the Hub with that token's account"
            )
        return (
            f"the repo is gated and HF_TOKEN is empty (HTTP {status}): accept its terms on "
            "the Hub, then set HF_TOKEN to a token of that account"
        )
    if isinstance(error, RepositoryNotFoundError):
        if token:
            return (
                f"the Hub has no such repo, or the token in HF_TOKEN cannot read it (HTTP "
                f"{status}): check the name, and the token's access to it"
            )
        return (
            f"the Hub has no such repo, or it is private or gated and HF_TOKEN is empty (HTTP "
            f"{status}): check the name, or set HF_TOKEN to a token that can read it"
        )
    if status == 401:
        return "the Hub refused the token in HF_TOKEN (HTTP 401): set a valid one"
    if status == 429:
        return "the Hub is rate limiting this address (HTTP 429): wait a while and start again"
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    return f"the Hub answered HTTP {status} ({first})"


@dataclass(frozen=True)
class Revision:
    sha: str
    sizes: dict[str, int]  # each file of the revision and its size in bytes


def _revision(repo_id: str) -> Revision:
    """The commit the Hub serves for `main` and its files with their sizes."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    try:
        # snapshot_download's default revision is main, so this asks for that branch too.
        sha = str(api.model_info(repo_id, revision="main").sha)
        tree = api.list_repo_tree(repo_id, revision=sha, recursive=True)
        sizes = {entry.path: int(entry.size) for entry in tree if hasattr(entry, "size")}
    except HfHubHTTPError as error:
        raise FetchError(hub_refusal(error)) from error
    except Exception as error:  # the transport's error types change between releases
        raise Unreachable(f"the Hub is unreachable ({type(error).__name__})") from error
    return Revision(sha, sizes)


def _no_space(needed: int, hub: Path) -> str:
    where, free = free_bytes(hub)
    return (
        f"needs {human(needed + SPACE_MARGIN)} free in {where} for the files still missing, "
        f"and it has {human(free)}: free space there or put HF_HOME on a larger disk "
        "(compose: MODEL_CACHE), then start again"
    )


def _download(item: Wanted, hub: Path, revision: Revision, prog: str) -> Path:
    """Fetch what the cache lacks of `revision`; finished files are kept on any failure."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import disable_progress_bars

    repo_dir = _repo_dir(hub, item.ref)
    snapshot = repo_dir / "snapshots" / revision.sha
    missing = {
        name: size for name, size in revision.sizes.items() if not (snapshot / name).is_file()
    }
    needed = sum(missing.values())
    if needed and needed + SPACE_MARGIN > free_bytes(hub)[1]:
        raise FetchError(_no_space(needed, hub))
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
                "the disk filled during the download; " + _no_space(left, hub)
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
    """True when every safetensors file is whole. A broken one is removed when `repair` (the
    caller downloads it again), else refused."""
    broken = broken_weights(snapshot)
    for bad in broken:
        if not repair:
            raise FetchError(
                f"{bad.path} is cut short or damaged ({bad.problem}): start once with "
                "HF_OFFLINE=0 to fetch it anew (or delete it)"
            )
        remove_broken(bad)
        print(
            f"{prog}: {item.knob} {item.ref}: {bad.path.name} in the cache is cut short or "
            f"damaged ({bad.problem}); removed it, downloading it again",
            file=sys.stderr,
        )
    return not broken


def fetch_one(item: Wanted, hf_home: Path, offline: bool, record: Record, prog: str) -> str:
    """Put one checkpoint into the cache, whole; return the line that says what happened."""
    if is_local(item.ref):
        if not Path(item.ref).is_dir():
            raise FetchError(f"{item.knob}={item.ref!r}: no such folder")
        return f"{item.knob} {item.ref}: a local folder, nothing to fetch"
    try:
        return _fetch_repo(item, hf_home, offline, record, prog)
    except FetchError as error:
        raise FetchError(f"{item.knob}={item.ref}: {error}") from error


def _fetch_repo(item: Wanted, hf_home: Path, offline: bool, record: Record, prog: str) -> str:
    known = record.complete(item.ref)
    if known is not None and _check_weights(item, known, repair=not offline, prog=prog):
        return f"{item.knob} {item.ref}: complete in the cache ({known}), nothing to fetch"
    if offline:
        cached = _cached(item.ref)
        if cached is None:
            raise FetchError("HF_OFFLINE=1 and it is not in the cache")
        _check_weights(item, cached, repair=False, prog=prog)
        return f"{item.knob} {item.ref}: in the cache ({cached}), offline (HF_OFFLINE=1)"
    hub = hf_home / "hub"
    repo_dir = _repo_dir(hub, item.ref)
    try:
        revision = _revision(item.ref)
    except Unreachable as error:
        cached = _cached(item.ref)
        if cached is None:
            raise FetchError(f"{error} and it is not in the cache") from error
        _check_weights(item, cached, repair=False, prog=prog)
        # Not recorded as complete: nobody could check it against the Hub.
        return f"{item.knob} {item.ref}: {error}; serving the cached snapshot as it is ({cached})"
    count, freed = remove_stale_partials(hub, repo_dir)
    if count:
        print(
            f"{prog}: {item.knob} {item.ref}: removed {count} partial file(s) a stopped fetch "
            f"left ({human(freed)})",
            file=sys.stderr,
        )
    before = _blob_bytes(repo_dir)
    snapshot = _download(item, hub, revision, prog)
    got = _blob_bytes(repo_dir) - before
    broken = broken_weights(snapshot)
    if broken:
        raise FetchError(
            f"the Hub served {broken[0].path.name} cut short or damaged ({broken[0].problem}): "
            "start again; if it stays so, the repo's file itself is broken"
        )
    record.add(item.ref, snapshot)
    return f"{item.knob} {item.ref}: {got / 2**20:.1f} MiB downloaded, complete ({snapshot})"


def run_fetch(
    env: Mapping[str, str], launcher: Launcher, prog: str, plan_json: str | None = None
) -> int:
    """The checkpoints of `launcher`'s settings from `env`, or, for a launcher's start, of the
    launch plan its first step made (`plan_json`: the settings are not resolved again)."""
    try:
        if plan_json is not None:
            settings = LaunchPlan.from_json(plan_json).settings()
        else:
            settings = resolve_settings(env, launcher)
    except KnobError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_BAD_KNOB
    hf_home = Path(settings["HF_HOME"])
    # huggingface_hub reads HF_HOME (and HF_TOKEN) from the environment.
    os.environ["HF_HOME"] = str(hf_home)
    offline = settings.values.HF_OFFLINE
    record = Record(hf_home)
    for item in wanted(settings):
        try:
            line = fetch_one(item, hf_home, offline, record, prog)
        except FetchError as error:
            print(f"{prog}: {error}", file=sys.stderr)
            return EXIT_FETCH_FAILED
        print(f"{prog}: {line}", file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> int:
    plan = sys.stdin.read() if args.plan_on_stdin else None
    return run_fetch(os.environ, args.launcher, args.prog, plan)


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
    parser.add_argument(
        "--plan-on-stdin",
        action="store_true",
        help="the launchers' own: the launch plan `knobs resolve` made comes on stdin",
    )
    parser.set_defaults(run=_run)
