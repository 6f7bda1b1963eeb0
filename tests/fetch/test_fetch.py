"""sparkserve fetch: what it downloads, what it finds in the cache, and its one-line failures,
with the real huggingface_hub (no Hub here: an unreachable endpoint stands for a network that
fails, and a test that needs no network proves it by pointing at that endpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.fetch.cache import Record
from sparkserve.fetch.wanted import Wanted, wanted
from sparkserve.launch.settings import resolve_settings

REPO = Path(__file__).resolve().parents[2]
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, connections are refused


def place(hub: Path, repo_id: str, files: dict[str, str]) -> Path:
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    return snapshot


def fetch(tmp_path: Path, launcher: str = "dflash", **knobs: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SPARKSERVE_"))}
    env.update(
        PYTHONPATH=str(REPO / "src"),
        HF_HOME=str(tmp_path / "hf"),
        HF_ENDPOINT=UNREACHABLE,
        HF_HUB_ETAG_TIMEOUT="2",
        HF_HUB_DOWNLOAD_TIMEOUT="2",
    )
    env.update(knobs)  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "sparkserve", "fetch", "--launcher", launcher],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def test_wanted_follows_the_launcher_and_the_draft_count() -> None:
    dflash = resolve_settings({}, "dflash")
    assert wanted(dflash) == [
        Wanted("MODEL", dflash.text["MODEL"]), Wanted("DRAFT_MODEL", dflash.text["DRAFT_MODEL"])
    ]  # fmt: skip
    assert wanted(resolve_settings({"NUM_SPEC_TOKENS": "0"}, "dflash")) == [
        Wanted("MODEL", dflash.text["MODEL"])
    ]
    assert [w.knob for w in wanted(resolve_settings({}, "mtp"))] == ["MODEL"]


def test_local_folders_need_nothing(tmp_path: Path) -> None:
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    target.mkdir()
    drafter.mkdir()
    done = fetch(tmp_path, MODEL=str(target), DRAFT_MODEL=str(drafter))
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("a local folder, nothing to fetch") == 2


def test_a_missing_local_folder_is_one_line(tmp_path: Path) -> None:
    done = fetch(tmp_path, MODEL=str(tmp_path / "nowhere"), NUM_SPEC_TOKENS="0")
    assert done.returncode == 4
    assert (
        done.stderr.strip()
        == f"sparkserve fetch: MODEL={str(tmp_path / 'nowhere')!r}: no such folder"
    )


def test_a_public_bind_address_without_a_key_downloads_nothing(tmp_path: Path) -> None:
    """compose's fetch service starts first: it refuses what the launcher would, before any
    download (exit 2, one line, no cache made)."""
    done = fetch(tmp_path, BIND_ADDRESS="0.0.0.0")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "sparkserve fetch: BIND_ADDRESS='0.0.0.0' publishes the API beyond this machine without "
        "API_KEY: set API_KEY (every client then sends it), or BIND_ADDRESS=127.0.0.1"
    )
    assert not (tmp_path / "hf").exists()


def test_offline_finds_the_cache_and_never_calls_the_hub(tmp_path: Path) -> None:
    place(tmp_path / "hf" / "hub", "org/target", {"config.json": "{}"})
    place(tmp_path / "hf" / "hub", "org/drafter", {"config.json": "{}"})
    done = fetch(tmp_path, MODEL="org/target", DRAFT_MODEL="org/drafter", HF_OFFLINE="1")
    assert done.returncode == 0, done.stderr
    assert (
        "MODEL org/target: in the cache" in done.stderr and "offline (HF_OFFLINE=1)" in done.stderr
    )
    assert "DRAFT_MODEL org/drafter: in the cache" in done.stderr


def test_offline_without_the_files_is_one_line(tmp_path: Path) -> None:
    done = fetch(tmp_path, MODEL="org/absent", NUM_SPEC_TOKENS="0", HF_OFFLINE="1")
    assert done.returncode == 4
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("sparkserve fetch: MODEL=org/absent: HF_OFFLINE=1 and it is not in")


def test_an_unreachable_hub_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    done = fetch(tmp_path, MODEL="org/absent", NUM_SPEC_TOKENS="0")
    assert done.returncode == 4, done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("sparkserve")]
    assert lines == [lines[-1]] and "MODEL=org/absent" in lines[0], done.stderr


def test_a_recorded_complete_fetch_needs_no_network(tmp_path: Path) -> None:
    snapshot = place(tmp_path / "hf" / "hub", "org/target", {"config.json": "{}", "w.bin": "x"})
    Record(tmp_path / "hf").add("org/target", snapshot)
    done = fetch(tmp_path, MODEL="org/target", NUM_SPEC_TOKENS="0")  # online, Hub unreachable
    assert done.returncode == 0, done.stderr
    assert "complete in the cache" in done.stderr and "nothing to fetch" in done.stderr

    # a file gone since: not complete any more, so it asks the Hub; unreachable, it serves
    # the cached snapshot as it is and says so, without recording it complete
    (snapshot / "w.bin").unlink()
    assert Record(tmp_path / "hf").complete("org/target") is None
    done = fetch(tmp_path, MODEL="org/target", NUM_SPEC_TOKENS="0")
    assert done.returncode == 0, done.stderr
    assert "the Hub is unreachable" in done.stderr and "serving the cached snapshot" in done.stderr
    assert Record(tmp_path / "hf").complete("org/target") is None


def test_a_corrupt_record_is_ignored(tmp_path: Path) -> None:
    record = tmp_path / "hf" / "sparkserve" / "fetched.json"
    record.parent.mkdir(parents=True)
    record.write_text("{not json")
    assert Record(tmp_path / "hf").complete("org/target") is None
    record.write_text(json.dumps({"org/target": {"snapshot": 3, "files": "x"}}))
    assert Record(tmp_path / "hf").complete("org/target") is None


@pytest.mark.parametrize(
    ("knobs", "expected"),
    [({"HF_OFFLINE": "2"}, "HF_OFFLINE='2': must be 0 or 1"),
     ({"NUM_SPEC_TOKENS": "x"}, "NUM_SPEC_TOKENS='x': must be an integer")],
)  # fmt: skip
def test_bad_knobs_are_one_line(tmp_path: Path, knobs: dict[str, str], expected: str) -> None:
    done = fetch(tmp_path, **knobs)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("sparkserve fetch: ") and expected in line


def safetensors_file(path: Path, values: int = 4) -> None:
    """A whole safetensors file of one float32 tensor, in the format's own layout: the 8-byte
    header length, the JSON header, the data."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [values], "data_offsets": [0, 4 * values]}})
    body = header.encode()
    path.write_bytes(len(body).to_bytes(8, "little") + body + bytes(4 * values))


def sharded(snapshot: Path, shards: int = 2) -> list[str]:
    """Index a checkpoint over `shards` files (model.safetensors.index.json), every shard whole."""
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for name in names:
        safetensors_file(snapshot / name)
    index = {"metadata": {"total_size": 16 * shards},
             "weight_map": {f"layer{i}.w": name for i, name in enumerate(names)}}  # fmt: skip
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
    return names


def fetch_check(tmp_path: Path, **knobs: str) -> subprocess.CompletedProcess:
    """`sparkserve fetch --check`, as the strict dry run runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SPARKSERVE_"))}
    env.update(PYTHONPATH=str(REPO / "src"), HF_HOME=str(tmp_path / "hf"),
               HF_ENDPOINT=UNREACHABLE, HF_HUB_ETAG_TIMEOUT="2", **knobs)  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "sparkserve", "fetch", "--launcher", "mtp", "--check"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}  # fmt: skip


@pytest.mark.parametrize("run", [fetch, fetch_check], ids=["fetch", "check"])
def test_a_shard_missing_offline_is_one_line_naming_it(tmp_path: Path, run: object) -> None:
    """A snapshot is whole only with every file its index lists: a shard deleted from the cache
    is refused before vLLM, in one line naming it, by the fetch and by the strict check alike
    (vLLM would fail at load, and Docker restart it in a loop)."""
    snapshot = place(tmp_path / "hf" / "hub", "org/target", {"config.json": "{}"})
    names = sharded(snapshot)
    whole = run(tmp_path, MODEL="org/target", NUM_SPEC_TOKENS="0", HF_OFFLINE="1")  # type: ignore[operator]
    assert whole.returncode == 0, whole.stderr
    (snapshot / names[1]).unlink()
    before = tree(tmp_path / "hf")
    done = run(tmp_path, MODEL="org/target", NUM_SPEC_TOKENS="0", HF_OFFLINE="1")  # type: ignore[operator]
    assert done.returncode == 4, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line == (
        f"sparkserve fetch: MODEL=org/target: {snapshot / names[1]} is missing "
        "(model.safetensors.index.json lists it): start once with HF_OFFLINE=0 to fetch it"
    )
    assert tree(tmp_path / "hf") == before  # nothing removed, nothing recorded


def test_a_shard_missing_with_the_hub_unreachable_is_refused_not_served(tmp_path: Path) -> None:
    """Online but the Hub cannot be asked: a cached snapshot is served as it is only when it is
    whole (before, one with a shard gone was taken and vLLM failed at load)."""
    snapshot = place(tmp_path / "hf" / "hub", "org/target", {"config.json": "{}"})
    names = sharded(snapshot, shards=3)
    (snapshot / names[0]).unlink()
    (snapshot / names[2]).unlink()
    for run in (fetch, fetch_check):
        done = run(tmp_path, MODEL="org/target", NUM_SPEC_TOKENS="0")
        assert done.returncode == 4, done.stderr
        line = done.stderr.strip().splitlines()[-1]
        assert line.endswith(
            f"MODEL=org/target: {snapshot / names[0]} is missing (model.safetensors.index.json "
            "lists it) (and 1 more): start again once the Hub can be reached, to fetch it"
        ), done.stderr


def test_a_local_folder_with_a_shard_missing_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "target"
    folder.mkdir()
    names = sharded(folder)
    assert fetch(tmp_path, MODEL=str(folder), NUM_SPEC_TOKENS="0").returncode == 0
    (folder / names[0]).write_bytes((folder / names[0]).read_bytes()[:20])  # cut short
    for run in (fetch, fetch_check):
        done = run(tmp_path, MODEL=str(folder), NUM_SPEC_TOKENS="0")
        assert done.returncode == 4, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"sparkserve fetch: MODEL={folder}: {folder / names[0]} is cut")
        assert line.endswith("a local folder is served as it is: complete it"), line


def test_the_check_passes_what_a_fetch_passes_and_changes_nothing(tmp_path: Path) -> None:
    snapshot = place(tmp_path / "hf" / "hub", "org/target", {"config.json": "{}"})
    sharded(snapshot)
    before = tree(tmp_path / "hf")
    done = fetch_check(tmp_path, MODEL="org/target", NUM_SPEC_TOKENS="0", HF_OFFLINE="1")
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"sparkserve fetch: MODEL org/target: in the cache ({snapshot}), offline (HF_OFFLINE=1)\n"
    )
    assert tree(tmp_path / "hf") == before
    absent = fetch_check(tmp_path, MODEL="org/absent", NUM_SPEC_TOKENS="0", HF_OFFLINE="1")
    assert absent.returncode == 4
    (line,) = absent.stderr.strip().splitlines()
    assert line == "sparkserve fetch: MODEL=org/absent: HF_OFFLINE=1 and it is not in the cache"
