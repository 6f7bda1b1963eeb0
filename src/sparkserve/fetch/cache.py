"""The model cache's side of a fetch: partial files a stopped fetch left, the free space a
download needs, and weight files whose length does not match their own header.

huggingface_hub (2.x) downloads each file to `blobs/ETAG.RANDOM.incomplete` and renames it
when it is whole; a killed process leaves that file behind, and no later download reuses it
(the name is unique to the process). Such a file is only ever removed here, and only while
nobody holds its blob's download lock (`hub/.locks/models--ORG--NAME/ETAG.lock`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from sparkserve.memory.checkpoint import CheckpointError, safetensors_length


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
