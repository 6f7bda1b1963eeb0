"""`sparkserve tune` against a real vLLM CPU server that mtp_serve.sh runs and the tune restarts
through its launcher driver (the plain tiny target, vLLM's ngram drafter, eager): the memory
loop finds the boundary a memory hog sets, a SIGTERM mid-run puts the starting setting back,
and the draft loop recommends the length it measured fastest. One server for the module: each
test starts from the setting the one before left."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sparkserve.memory.host import GIB, read_meminfo
from sparkserve.server.driver import process_environ
from support.cpu_launch import EAGER, launcher_server
from support.memory_cgroup import MemoryCgroup, memory_cgroup
from support.vllm_server import VllmServer, stop_group_of, tail

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SMALL, LARGE = "0.5", "4"  # KV_CACHE_GB: the hog leaves room for the small pool only
UNFIT = "64"  # more than this machine has: the plan refuses it, nothing starts
MARGIN_GIB = 1.75  # half the two pools' difference: the hog's boundary lies midway
HOG_GIB = 1.0  # what the hog holds in the memory loop's cgroup
RESERVE_GIB = 4.0  # the test servers' OS_RESERVE_GB (support/cpu_launch.py)


class Tuned:
    """The module's server: its URL, the pid file the tune keeps up to date, and the memory
    cgroup it runs in (no limit but in the memory loop's test)."""

    def __init__(self, first: VllmServer, pid_file: Path, cgroup: MemoryCgroup) -> None:
        self.url = first.base_url
        self.pid_file = pid_file
        self.first = first
        self.cgroup = cgroup

    @property
    def pid(self) -> int:
        return int(self.pid_file.read_text())

    def knob(self, name: str) -> str | None:
        return process_environ(self.pid).get(name)

    def healthy(self) -> bool:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/health", timeout=5) as reply:
            return reply.status == 200


@pytest.fixture(scope="module")
def tuned(
    tiny_models: dict[str, str], sparkserve_site: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tuned]:
    work = tmp_path_factory.mktemp("tuned-server")
    knobs = {
        "MODEL": tiny_models["plain"],
        "SPEC_METHOD": "ngram",
        "NUM_SPEC_TOKENS": "2",
        "PREFIX_CACHE": "0",
        "KV_CACHE_GB": SMALL,
        "EXTRA_ARGS": EAGER,  # the pool comes from KV_CACHE_GB, the knob the tune changes
    }
    # In a memory cgroup of its own (no limit yet): the memory loop's test sets one, so that
    # its hog fills the cgroup and not the host (tests/support/memory_cgroup.py).
    with memory_cgroup(None) as cgroup:
        server = launcher_server(
            work, "mtp", tiny_models, sparkserve_site, knobs, preexec=cgroup.preexec
        ).start()
        pid_file = work / "server.pid"
        assert server.proc is not None
        pid_file.write_text(f"{server.proc.pid}\n")
        try:
            server.wait_healthy()
            yield Tuned(server, pid_file, cgroup)
        finally:
            server.stop(timeout_s=30)
            stop_group_of(pid_file)  # the launcher the tune started last


def tune_argv(tuned: Tuned, loop: str, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "sparkserve", "tune", loop, "--driver", "launcher",
        "--launcher", "mtp", "--pid-file", str(tuned.pid_file), "--url", tuned.url,
        "--out", str(out), "--healthy-timeout-s", "300", *extra,
    ]  # fmt: skip


MEMORY_OPTIONS = ("--bank", "1,2", "--prompt-tokens", "256", "--gen-tokens", "32",
                  "--settle-s", "0.5")  # fmt: skip

HOG = """
import sys, time
size = int(sys.argv[1])
block = bytearray(size)
block[::4096] = b"\\x01" * len(range(0, size, 4096))  # every page touched
print("held", flush=True)
time.sleep(3600)
"""


@pytest.mark.e2e
@pytest.mark.memory_hog
def test_memory_loop_keeps_the_largest_pool_the_hog_leaves_room_for(
    tuned: Tuned, tmp_path: Path
) -> None:
    # The server runs the small pool now, in its memory cgroup; the tune, its servers and
    # the hog run there too, under a limit that leaves MARGIN_GIB above the reserve once the
    # hog holds its share: the small pool passes with that margin and the large one (3.5 GiB
    # more) ends MARGIN_GIB under it. The hog fills the cgroup, not the host: the other test
    # process's servers move neither the boundary nor the verdicts.
    cgroup = tuned.cgroup
    if read_meminfo().available < (RESERVE_GIB + MARGIN_GIB + HOG_GIB + 1) * GIB:
        pytest.skip("too little memory available for the test's cgroup")
    cgroup.set_limit(cgroup.usage() + int((RESERVE_GIB + MARGIN_GIB + HOG_GIB) * GIB))
    hog = subprocess.Popen(
        [sys.executable, "-c", HOG, str(int(HOG_GIB * GIB))],
        stdout=subprocess.PIPE, text=True, preexec_fn=cgroup.preexec,
    )  # fmt: skip
    try:
        assert hog.stdout is not None and hog.stdout.readline().strip() == "held"
        out = tmp_path / "memory"
        done = subprocess.run(
            tune_argv(tuned, "memory", out, "--candidates", f"{SMALL},{LARGE},{UNFIT}",
                      *MEMORY_OPTIONS),
            capture_output=True, text=True, timeout=900, preexec_fn=cgroup.preexec,
        )  # fmt: skip
    finally:
        hog.kill()
        hog.wait()
        cgroup.set_limit(None)  # the module's next tests run the kept server as before
    print(done.stderr)
    assert done.returncode == 0, done.stderr + tail(out / "server.log")
    assert done.stdout == f"KV_CACHE_GB={SMALL}\n"
    assert "2 candidate(s), each a restart" in done.stderr  # the estimate, before anything
    assert "2/3 candidates done" in done.stderr  # progress
    assert f"restarting with KV_CACHE_GB={UNFIT}" not in done.stderr
    result = json.loads((out / "tune-memory.json").read_text())
    trials = {t["value"]: t for t in result["candidates"]}
    assert [t["value"] for t in result["candidates"]] == [UNFIT, LARGE, SMALL]  # largest first
    assert trials[UNFIT]["verdict"] == "REFUSED" and trials[UNFIT]["restart_s"] is None
    assert trials[SMALL]["verdict"] == "PASS" and trials[SMALL]["min_available_gib"] > RESERVE_GIB
    # the large pool is unsafe: its stress run fails, or on a busier machine the memory guard
    # stops its start (a NO-START with the guard's line)
    large = trials[LARGE]
    if large["verdict"] == "FAIL":
        assert large["min_available_gib"] < RESERVE_GIB
        assert large["pool_tokens"] > trials[SMALL]["pool_tokens"]
        assert len(result["restart_s"]) == 2  # the restarts that came up healthy
    else:
        assert large["verdict"] == "NO-START" and "the memory guard stopped it" in large["line"]
        assert len(result["restart_s"]) == 1
    assert result["kept"] == SMALL and result["running"] == SMALL
    assert (out / "tune-memory.png").read_bytes()[:8] == PNG_MAGIC
    # Left running with the value kept, never with the one that failed.
    assert tuned.knob("KV_CACHE_GB") == SMALL and tuned.healthy()


@pytest.mark.e2e
def test_a_tune_killed_mid_run_puts_the_starting_setting_back(tuned: Tuned, tmp_path: Path) -> None:
    start = tuned.knob("KV_CACHE_GB")
    tune = subprocess.Popen(
        tune_argv(tuned, "memory", tmp_path / "killed", "--candidates", "1.5", *MEMORY_OPTIONS),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert tune.stderr is not None
    seen: list[str] = []
    for line in tune.stderr:
        seen.append(line)
        if line.startswith("[tune] restarting with KV_CACHE_GB=1.5"):
            break
    time.sleep(2.0)  # the candidate's server is starting
    tune.send_signal(signal.SIGTERM)
    stdout, stderr = tune.communicate(timeout=400)
    log = "".join(seen) + stderr
    print(log)
    assert tune.returncode == 130, log
    assert stdout == ""
    assert f"the server runs with KV_CACHE_GB={start} again" in log
    assert tuned.knob("KV_CACHE_GB") == start and tuned.healthy()
    # the launcher's `vllm serve` child got the starting pool again
    (vllm,) = [p for p in psutil.Process(tuned.pid).children() if "serve" in p.cmdline()[:3]]
    assert str(int(float(start or 0) * GIB)) in vllm.cmdline()


@pytest.mark.e2e
def test_draft_loop_recommends_the_length_it_measured_fastest(tuned: Tuned, tmp_path: Path) -> None:
    # Text that repeats itself: ngram drafts are accepted on it, so the lengths differ.
    prompts = tmp_path / "prompts.jsonl"
    line = "alpha beta gamma delta epsilon zeta eta theta iota kappa "
    prompts.write_text("".join(json.dumps({"prompt": line * (8 + i)}) + "\n" for i in range(2)))
    out = tmp_path / "draft"
    done = subprocess.run(
        tune_argv(tuned, "draft", out, "--lengths", "2,0", "--prompts-file", str(prompts),
                  "--api", "completions", "--gen-tokens", "96"),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    print(done.stderr)
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "tune-draft.json").read_text())
    speeds = {row["length"]: row["tok_s"] for row in result["lengths"]}
    fastest = max(speeds, key=lambda n: speeds[n])
    assert result["recommended"] == fastest and done.stdout == f"NUM_SPEC_TOKENS={fastest}\n"
    assert speeds[0] != speeds[2]
    by_length = {row["length"]: row for row in result["lengths"]}
    assert (
        by_length[2]["spec"]["drafts"] > 0
        and len(by_length[2]["spec"]["acceptance_per_position"]) == 2
    )
    assert not by_length[0]["spec"]["drafts"]
    assert result["method"] == "ngram"
    assert (out / "tune-draft.png").read_bytes()[:8] == PNG_MAGIC
    assert tuned.knob("NUM_SPEC_TOKENS") == str(fastest) and tuned.healthy()
