"""Replace a file whole or not at all: `.env` (which holds API_KEY and HF_TOKEN), the tools'
reports, the guard's record.

Written in place, a crash, a kill or a full disk in the middle leaves the file cut short (a
`.env` without its token, a report that is not JSON). Here the text goes into a temporary file
in the same folder (a rename is atomic only within one filesystem), is flushed to the disk
(fsync), takes the old file's mode (a `.env` kept at 0600 stays 0600; a new file gets what the
umask gives), and is renamed over the old one: a reader sees the old file or the new one, never
a part. On any failure the temporary file is removed, the old file is left as it was, and the
OSError is raised to the caller.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import stat
from pathlib import Path
from typing import Any


def replace_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically (the module docstring); OSError on failure."""
    path = Path(os.path.realpath(path))  # a symlinked .env: replace its target, keep the link
    try:
        mode: int | None = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None
    name = str(path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # A new file gets 0666 less the umask, as open() would give it; an old one's mode is set
    # below, before the rename, so the new text is never readable by more than the old was.
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if mode is not None else 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(name, mode)
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    _sync_folder(path.parent)


def replace_text(path: Path, text: str, encoding: str = "utf-8") -> None:
    """replace_bytes for text."""
    replace_bytes(path, text.encode(encoding))


def replace_figure(figure: Any, path: Path, dpi: int) -> None:
    """A matplotlib figure saved as PNG, replaced whole (rendered in memory first)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    replace_bytes(path, buffer.getvalue())


def _sync_folder(folder: Path) -> None:
    """Flush the rename itself (the folder's entry); best effort: some filesystems refuse."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
