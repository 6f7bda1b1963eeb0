"""Download progress as whole log lines, for a fetch whose stderr is not a terminal.

huggingface_hub's progress bars redraw one line with carriage returns; `docker compose logs`
only shows a line once it ends, so a 67 GiB download would look silent for an hour. This
reporter prints a line each time a file is finished and at least every `every_s` seconds,
counting what is in the cache: finished files by their snapshot entries, the file in flight
by its partial blob.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path

POLL_S = 0.5


def human(count: float) -> str:
    """A size in MiB, or GiB from 1 GiB up: "3.1 MiB", "67.0 GiB"."""
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def size_text(count: float, total: float) -> str:
    """Both sizes in the unit that suits the total: "1.2 of 3.9 MiB", "12.0 of 67.1 GiB"."""
    unit, scale = ("GiB", 2**30) if total >= 2**30 else ("MiB", 2**20)
    return f"{count / scale:.1f} of {total / scale:.1f} {unit}"


class Progress(threading.Thread):
    """Prints `prefix: N of M files, X of Y MiB (P%), R MiB/s` while a snapshot fills."""

    def __init__(
        self, prefix: str, snapshot: Path, blobs: Path, sizes: dict[str, int], every_s: float
    ) -> None:
        super().__init__(daemon=True)
        self.prefix, self.snapshot, self.blobs = prefix, snapshot, blobs
        self.sizes, self.every_s = sizes, every_s
        self.total = sum(sizes.values())
        self.stopped = threading.Event()

    def _state(self) -> tuple[int, int]:
        done = [name for name in self.sizes if (self.snapshot / name).is_file()]
        partial = 0
        for path in self.blobs.glob("*.incomplete"):
            # finished and renamed between the listing and the stat: counted as done next time
            with contextlib.suppress(OSError):
                partial += path.stat().st_size
        return len(done), sum(self.sizes[name] for name in done) + partial

    def run(self) -> None:
        started = time.monotonic()
        files, start_bytes = self._state()
        last_line, last_files = started, files
        while not self.stopped.wait(POLL_S):
            files, count = self._state()
            now = time.monotonic()
            if files == last_files and now - last_line < self.every_s:
                continue
            rate = max(count - start_bytes, 0) / max(now - started, 1e-3) / 2**20
            percent = 100 * count / self.total if self.total else 100.0
            print(
                f"{self.prefix}: {files} of {len(self.sizes)} files, "
                f"{size_text(count, self.total)} ({percent:.0f}%), {rate:.1f} MiB/s",
                file=sys.stderr, flush=True,
            )  # fmt: skip
            last_line, last_files = now, files

    def stop(self) -> None:
        self.stopped.set()
        self.join()
