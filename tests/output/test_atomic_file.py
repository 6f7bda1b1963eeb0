"""sparkserve.output.atomic_file on real files: the mode kept, a new file made as open() would make
it, a symlink's target replaced, and a write that fails (a full tmpfs, a file-size limit)
leaving the old file as it was, with no temporary file behind."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from sparkserve.output.atomic_file import replace_bytes, replace_text
from support.tmpfs import tiny_tmpfs

OLD = "API_KEY=secret\nHF_TOKEN=hf_abc\n"


def test_the_text_is_replaced_and_the_mode_kept(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    path.write_text(OLD)
    path.chmod(0o600)
    replace_text(path, OLD + "GPU_MEM=0.8\n")
    assert path.read_text() == OLD + "GPU_MEM=0.8\n"
    assert path.stat().st_mode & 0o7777 == 0o600
    assert os.listdir(tmp_path) == [".env"]


def test_a_new_file_gets_what_the_umask_gives(tmp_path: Path) -> None:
    previous = os.umask(0o027)
    try:
        replace_bytes(tmp_path / "report.json", b"{}\n")
    finally:
        os.umask(previous)
    assert (tmp_path / "report.json").stat().st_mode & 0o7777 == 0o640


def test_a_symlink_keeps_pointing_at_its_replaced_target(tmp_path: Path) -> None:
    target = tmp_path / "secrets.env"
    target.write_text(OLD)
    target.chmod(0o600)
    link = tmp_path / ".env"
    link.symlink_to(target)
    replace_text(link, "PORT=9000\n")
    assert link.is_symlink() and target.read_text() == "PORT=9000\n"
    assert target.stat().st_mode & 0o7777 == 0o600


def test_a_full_disk_leaves_the_old_file_whole(tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path / "disk") as disk:
        path = disk / ".env"
        path.write_text(OLD)
        path.chmod(0o600)
        with pytest.raises(OSError, match="No space left on device"):
            replace_text(path, OLD + "x" * (1 << 20))
        assert path.read_text() == OLD
        assert path.stat().st_mode & 0o7777 == 0o600
        assert os.listdir(disk) == [".env"]


def test_a_write_past_the_file_size_limit_leaves_the_old_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "stress.json"
    path.write_text('{"old": true}\n')
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # Files may not grow past 1 KiB (Python ignores SIGXFSZ: the write fails with EFBIG).
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
    try:
        with pytest.raises(OSError, match="File too large"):
            replace_text(path, "x" * 4096)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert path.read_text() == '{"old": true}\n'
    assert os.listdir(tmp_path) == ["stress.json"]
