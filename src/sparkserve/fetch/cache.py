"""The model cache's side of a fetch: partial files a stopped fetch left, the free space a
download needs, and a snapshot that is not whole: a weight file its index lists that is not
there, or one whose length does not match its own header.

huggingface_hub (2.x) downloads each file to `blobs/ETAG.RANDOM.incomplete` and renames it
when it is whole; a killed process leaves that file behind, and no later download reuses it
(the name is unique to the process). Such a file is only ever removed here, and only while
nobody holds its blob's download lock (`hub/.locks/models--ORG--NAME/ETAG.lock`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from sparkserve.memory.checkpoint import INDEX, CheckpointError, safetensors_length, weights_index


def locks_dir(hub: Path, repo_dir: Path) -> Path:
    return hub / ".locks" / repo_dir.name


def remove_stale_partials(hub: Path, repo_dir: Path) -> tuple[int, int]:
    """Delete the partial downloads nobody is writing; how many, and the bytes freed."""
    from filelock import FileLock, Timeout

    count = freed = 0
    for partial in sorted((repo_dir / "blobs").glob("*.incomplete")):
        etag = partial.name.split(".", 1)[0]
        lock_path = locks_dir(hub, repo_dir) / f"{etag}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(str(lock_path), timeout=0):
                size = partial.stat().st_size
                partial.unlink()
                count, freed = count + 1, freed + size
        except (Timeout, FileNotFoundError):  # being downloaded now, or gone already
            continue
    return count, freed


def free_bytes(folder: Path) -> tuple[Path, int]:
    """The nearest existing folder at or above `folder`, and the bytes free on its disk."""
    for candidate in (folder, *folder.parents):
        if candidate.is_dir():
            return candidate, shutil.disk_usage(candidate).free
    return folder, 0


@dataclass(frozen=True)
class Broken:
    path: Path  # the snapshot's entry (a link into blobs/)
    problem: str  # e.g. "3000000 bytes, its header says 3281768"
    missing: bool = False  # not there at all (its index lists it)

    def line(self) -> str:
        """What is wrong with it, for a one-line refusal."""
        if self.missing:
            return f"{self.path} is missing ({self.problem})"
        return f"{self.path} is cut short or damaged ({self.problem})"


def incomplete(snapshot: Path) -> list[Broken]:
    """What keeps the snapshot from being whole: each file its weights index lists that is not
    there, then each safetensors file whose size is not the one its own header gives. A
    snapshot is complete only when this is empty: vLLM would fail at load otherwise."""
    try:
        index = weights_index(snapshot)
    except CheckpointError as error:
        return [Broken(snapshot / INDEX, str(error).removeprefix(f"{snapshot / INDEX}: "))]
    listed = sorted(index[1]) if index is not None else []
    missing = [
        Broken(snapshot / name, f"{INDEX} lists it", missing=True)
        for name in listed
        if not (snapshot / name).is_file()
    ]
    return missing + broken_weights(snapshot)


def broken_weights(snapshot: Path) -> list[Broken]:
    """Each safetensors file of the snapshot whose size is not the one its header gives, or
    whose header cannot be read."""
    broken = []
    for path in sorted(snapshot.rglob("*.safetensors")):
        if not path.is_file():
            continue
        try:
            want = safetensors_length(path)
        except CheckpointError as error:
            broken.append(Broken(path, str(error).removeprefix(f"{path}: ")))
            continue
        have = path.stat().st_size
        if have != want:
            broken.append(Broken(path, f"{have} bytes, its header says {want}"))
    return broken


def remove_broken(item: Broken) -> None:
    """Drop a broken file from the cache (its blob and its snapshot entry), so that the next
    download fetches it whole."""
    blob = item.path.resolve()
    item.path.unlink(missing_ok=True)
    if blob != item.path:
        blob.unlink(missing_ok=True)


RECORD = Path("sparkserve") / "fetched.json"  # under HF_HOME


def repo_dir_of(hub: Path, repo_id: str) -> Path:
    return hub / ("models--" + repo_id.replace("/", "--"))


def blob_bytes(repo_dir: Path) -> int:
    blobs = repo_dir / "blobs"
    if not blobs.is_dir():
        return 0
    return sum(p.stat().st_size for p in blobs.iterdir() if p.is_file())


def snapshot_files(snapshot: Path) -> list[str]:
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
        self.entries[repo_id] = {"snapshot": str(snapshot), "files": snapshot_files(snapshot)}
        partial = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(self.entries, indent=1, sort_keys=True) + "\n")
            partial.replace(self.path)
        except OSError:
            partial.unlink(missing_ok=True)
