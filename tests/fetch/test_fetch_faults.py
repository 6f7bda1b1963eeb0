"""Download faults of `sparkserve fetch`, with the real huggingface_hub client against a real
Hub-compatible server that is not ours: olah (PyPI), a self-hosted Hugging Face mirror serving
the tiny plain target as a git repo on 127.0.0.1 (tests/support/hub_mirror.py). A slow link
(tests/support/slow_link.py) stretches a download so it can be stopped half-way; a small
tmpfs stands for a disk that fills. What the user sees and does for each: docs/DOWNLOADS.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sparkserve.memory.checkpoint import safetensors_length
from tests.support.hub_mirror import HubMirror, make_repo, start_mirror
from tests.support.slow_link import SlowLink

REPO = Path(__file__).resolve().parents[2]
TARGET = "org/tiny"  # served to anyone
GATED = "org/tiny-gated"  # olah denies it: 401 RepoNotFound, as the Hub answers a hidden repo
SLOW = 1024 * 1024  # bytes a second per connection: the 3.1 MiB weights take about 3 s


class Served:
    def __init__(self, mirror: HubMirror, sha: str, files: Path) -> None:
        self.mirror, self.sha = mirror, sha
        self.sizes = {p.name: p.stat().st_size for p in files.iterdir() if p.is_file()}
        self.sizes.pop(".sparkserve-tiny.json", None)

    def snapshot(self, hf_home: Path) -> Path:
        return hf_home / "hub" / ("models--" + TARGET.replace("/", "--")) / "snapshots" / self.sha

    def blobs(self, hf_home: Path) -> Path:
        return self.snapshot(hf_home).parents[1] / "blobs"


@pytest.fixture(scope="module")
def served(
    tiny_models: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    olah = os.environ.get("SPARKSERVE_OLAH", "")
    if not olah:
        pytest.skip("SPARKSERVE_OLAH is unset: run through ./scripts/test.sh, which builds olah")
    work = tmp_path_factory.mktemp("hub-mirror")
    files = Path(tiny_models["plain"])
    sha = make_repo(work / "mirrors", TARGET, files)
    make_repo(work / "mirrors", GATED, files)
    mirror = start_mirror(olah, work, deny=[GATED], ready_repo=TARGET)
    try:
        yield Served(mirror, sha, files)
    finally:
        mirror.stop()


def fetch_env(hf_home: Path, endpoint: str, **knobs: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SPARKSERVE_"))}
    env.update(
        PYTHONPATH=str(REPO / "src"), HF_HOME=str(hf_home), HF_ENDPOINT=endpoint,
        MODEL=TARGET, NUM_SPEC_TOKENS="0", HF_HUB_DISABLE_TELEMETRY="1",
    )  # fmt: skip
    env.update(knobs)
    return env


def start_fetch(hf_home: Path, endpoint: str, **knobs: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sparkserve", "fetch", "--launcher", "mtp"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=fetch_env(hf_home, endpoint, **knobs),
    )  # fmt: skip


def fetch(
    hf_home: Path, endpoint: str, *options: str, **knobs: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkserve", "fetch", "--launcher", "mtp", *options],
        capture_output=True, text=True, timeout=120, env=fetch_env(hf_home, endpoint, **knobs),
    )  # fmt: skip


def our_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("sparkserve fetch: ")]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    """Until `condition()`; `timeout` guards against a hang, it is no speed target."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def assert_whole(served: Served, hf_home: Path) -> None:
    """Every file of the revision in the snapshot at its served size, no partial file left."""
    snapshot = served.snapshot(hf_home)
    assert {name: (snapshot / name).stat().st_size for name in served.sizes} == served.sizes
    weights = snapshot / "model.safetensors"
    assert safetensors_length(weights) == weights.stat().st_size
    assert not list(served.blobs(hf_home).glob("*.incomplete"))


def assert_nothing_taken_as_complete(served: Served, hf_home: Path) -> None:
    """What a later start would trust: no record of the repo, no partial file, and each
    snapshot entry present is the whole file."""
    record = hf_home / "sparkserve" / "fetched.json"
    assert not record.exists() or TARGET not in json.loads(record.read_text())
    assert not record.with_suffix(".tmp").exists()
    assert not list(served.blobs(hf_home).glob("*.incomplete"))
    snapshot = served.snapshot(hf_home)
    for name, size in served.sizes.items():
        if (snapshot / name).exists():
            assert (snapshot / name).stat().st_size == size, name


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """mount(size) -> a fresh tmpfs of that size (e.g. "2m"); remounted by calling it again."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = False

    def mount(size: str) -> Path:
        nonlocal mounted
        options = f"size={size}" if not mounted else f"remount,size={size}"
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (root needed): {done.stderr.strip()}")
        mounted = True
        return mount_point

    try:
        yield mount
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_progress_and_a_killed_fetch_resumes_without_the_finished_files(
    served: Served, tmp_path: Path
) -> None:
    hf_home = tmp_path / "hf"
    snapshot = served.snapshot(hf_home)
    before = Counter(served.mirror.fetched())
    with SlowLink(served.mirror.port, SLOW) as link:
        first = start_fetch(hf_home, link.url)
        # killed once the tokenizer is whole and the weights are under way (about 0.6 s in,
        # 2.5 s before the weights end; huggingface_hub writes in 10 MiB pieces, so the
        # weights' partial file is still empty)
        wait_for(lambda: (snapshot / "tokenizer.json").is_file(), "the tokenizer done")
        assert not (snapshot / "model.safetensors").exists()
        first.send_signal(signal.SIGKILL)
        _, killed_stderr = first.communicate(timeout=120)
    progress = [line for line in our_lines(killed_stderr) if " files, " in line]
    assert progress, killed_stderr
    assert re.fullmatch(
        rf"sparkserve fetch: MODEL {TARGET}: \d of {len(served.sizes)} files, "
        r"\d+\.\d of \d+\.\d MiB \(\d+%\), \d+\.\d MiB/s",
        progress[0],
    ), progress
    assert "\r" not in killed_stderr  # whole lines only: what `docker compose logs` shows
    left = list(served.blobs(hf_home).glob("*.incomplete"))
    assert left  # what the kill left: huggingface_hub never reuses it

    with SlowLink(served.mirror.port, None) as counted:
        again = fetch(hf_home, counted.url)
    assert again.returncode == 0, again.stderr
    lines = our_lines(again.stderr)
    assert re.search(r"removed 1 partial file\(s\) a stopped fetch left \(\d+\.\d MiB\)", lines[0])
    assert lines[-1].startswith(f"sparkserve fetch: MODEL {TARGET}: ") and "complete" in lines[-1]
    assert_whole(served, hf_home)
    # each file finished before the kill was fetched once, the weights twice
    got = Counter(served.mirror.fetched()) - before
    assert got == Counter({f"{TARGET}/{name}": 1 for name in served.sizes}) + Counter(
        {f"{TARGET}/model.safetensors": 1}
    ), got
    # and the second run received the weights, not the finished files (64 KiB: the listing)
    assert counted.bytes_down < served.sizes["model.safetensors"] + 64 * 1024


def test_a_disk_too_small_is_refused_before_any_download(
    served: Served, small_disk: Callable[[str], Path]
) -> None:
    hf_home = small_disk("2m") / "hf"
    before = Counter(served.mirror.fetched())
    done = fetch(hf_home, served.mirror.url)
    assert done.returncode == 4, done.stderr
    (line,) = our_lines(done.stderr)
    assert re.fullmatch(
        rf"sparkserve fetch: MODEL={TARGET}: needs \d+\.\d MiB free in "
        rf"{re.escape(str(hf_home.parent))} for the files still missing, and it has "
        r"\d+\.\d MiB: free space there or put HF_HOME "
        r"on a larger disk \(compose: MODEL_CACHE\), then start again",
        line,
    ), line
    assert Counter(served.mirror.fetched()) == before  # no file was asked for
    assert_nothing_taken_as_complete(served, hf_home)

    small_disk("16m")
    done = fetch(hf_home, served.mirror.url)
    assert done.returncode == 0, done.stderr
    assert_whole(served, hf_home)


def test_a_disk_that_fills_during_the_download_leaves_nothing_half_done(
    served: Served, small_disk: Callable[[str], Path]
) -> None:
    disk = small_disk("8m")
    hf_home = disk / "hf"
    filler = disk / "filler"
    with SlowLink(served.mirror.port, SLOW) as link:
        running = start_fetch(hf_home, link.url)
        # the weights under way: the tokenizer whole, the weights not yet (see above)
        wait_for(lambda: (served.snapshot(hf_home) / "tokenizer.json").is_file(), "the tokenizer")
        assert not (served.snapshot(hf_home) / "model.safetensors").exists()
        with filler.open("wb") as handle:  # another writer takes the rest of the disk
            try:
                while True:
                    handle.write(b"\0" * 65536)
                    handle.flush()
            except OSError:
                pass
        _, stderr = running.communicate(timeout=120)
    assert running.returncode == 4, stderr
    (line,) = [line for line in our_lines(stderr) if " files, " not in line]
    assert (
        line.startswith(
            f"sparkserve fetch: MODEL={TARGET}: the disk filled during the download; needs "
        )
        and f"free in {hf_home}" in line
    ), line
    assert_nothing_taken_as_complete(served, hf_home)

    filler.unlink()
    done = fetch(hf_home, served.mirror.url)
    assert done.returncode == 0, done.stderr
    assert_whole(served, hf_home)


def test_a_truncated_weight_file_in_the_cache_is_found_before_vllm(
    served: Served, tmp_path: Path
) -> None:
    hf_home = tmp_path / "hf"
    assert fetch(hf_home, served.mirror.url).returncode == 0
    weights = served.snapshot(hf_home) / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights.resolve(), size // 2)  # the blob the snapshot links to

    offline = fetch(hf_home, served.mirror.url, HF_OFFLINE="1")
    assert offline.returncode == 4
    (line,) = our_lines(offline.stderr)
    assert line == (
        f"sparkserve fetch: MODEL={TARGET}: {weights} is cut short or damaged ({size // 2} "
        f"bytes, its header says {size}): start once with HF_OFFLINE=0 to fetch it anew (or "
        "delete it)"
    )

    before = Counter(served.mirror.fetched())
    online = fetch(hf_home, served.mirror.url)
    assert online.returncode == 0, online.stderr
    assert "model.safetensors in the cache is cut short or damaged" in our_lines(online.stderr)[0]
    assert Counter(served.mirror.fetched()) - before == Counter({f"{TARGET}/model.safetensors": 1})
    assert_whole(served, hf_home)


@pytest.mark.parametrize(
    ("token", "expected"),
    [("", "and HF_TOKEN is empty (HTTP 401): check the name, or set HF_TOKEN to a token"),
     ("hf_not_a_real_token", "or the token in HF_TOKEN cannot read it (HTTP 401)")],
)  # fmt: skip
def test_a_repo_the_token_cannot_read_is_one_line(
    served: Served, tmp_path: Path, token: str, expected: str
) -> None:
    done = fetch(tmp_path / "hf", served.mirror.url, MODEL=GATED, HF_TOKEN=token)
    assert done.returncode == 4
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"sparkserve fetch: MODEL={GATED}: the Hub has no such repo") and (
        expected in line
    ), line
    assert token == "" or token not in done.stderr


def test_the_check_asks_the_hub_and_measures_the_disk_but_downloads_nothing(
    served: Served, small_disk: Callable[[str], Path]
) -> None:
    """`fetch --check` (the strict dry run's, before scripts/up.sh lets Compose touch the
    running server): the Hub's answer and the disk's room refuse as the fetch would, and no
    file is downloaded either way."""
    hf_home = small_disk("2m") / "hf"
    before = Counter(served.mirror.fetched())
    short = fetch(hf_home, served.mirror.url, "--check")
    assert short.returncode == 4, short.stderr
    (line,) = our_lines(short.stderr)
    assert line.startswith(f"sparkserve fetch: MODEL={TARGET}: needs "), line
    assert "for the files still missing" in line, line

    small_disk("16m")
    room = fetch(hf_home, served.mirror.url, "--check")
    assert room.returncode == 0, room.stderr
    (line,) = our_lines(room.stderr)
    assert re.fullmatch(
        rf"sparkserve fetch: MODEL {TARGET}: {len(served.sizes)} file\(s\) of revision "
        rf"{served.sha[:12]} to download \(\d+\.\d MiB\); the disk has room",
        line,
    ), line
    gated = fetch(hf_home, served.mirror.url, "--check", MODEL=GATED)
    assert gated.returncode == 4
    (line,) = our_lines(gated.stderr)
    assert line.startswith(f"sparkserve fetch: MODEL={GATED}: the Hub has no such repo"), line
    assert Counter(served.mirror.fetched()) == before  # no file was asked for
    assert not (hf_home / "hub" / ("models--" + TARGET.replace("/", "--")) / "blobs").exists()

    assert fetch(hf_home, served.mirror.url).returncode == 0
    whole = fetch(hf_home, served.mirror.url, "--check", HF_OFFLINE="1")
    assert whole.returncode == 0, whole.stderr
    assert "complete in the cache" in whole.stderr
