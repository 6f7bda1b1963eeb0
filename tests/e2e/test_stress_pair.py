"""`sparkserve stress` on a pair (CLUSTER_NODES=2) against the run's real vLLM CPU server: with
a real pair of watches both hosts' readings come into the report; with the head's watch played
by a small wire server, the worker's memory fails a run this host passes; an unreachable
watch is one line and this host is judged alone."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sparkserve.cli import main
from support.vllm_server import LOOPBACK, VllmServer, free_port
from support.watch_stand_in import WatchStandIn, about, pair_env
from support.watches import wait_joined, watch_argv


def stress(server: VllmServer, out: Path) -> int:
    return main(
        [
            "stress", "--url", server.base_url, "--out", str(out), "--settle-s", "1.5",
            "--progress-s", "1", "--bank", "1", "--prompt-tokens", "200", "--gen-tokens", "16",
            "--os-reserve-gb", "0.5",
        ]
    )  # fmt: skip


@pytest.mark.e2e
def test_stress_on_a_pair_judges_both_hosts(
    shared_server: VllmServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the worker's memory collapses after the first readings; the head stays well
    watch = WatchStandIn([about(30.0, 40.0), about(30.0, 40.0), about(29.0, 0.25, 2.0)])
    try:
        for name, value in pair_env(watch.port).items():
            monkeypatch.setenv(name, value)
        code = stress(shared_server, tmp_path / "pair")
    finally:
        watch.close()
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert code == 1, captured
    assert lines[-1].startswith("FAIL: the worker's MemAvailable fell to 0.25 GiB, under the OS")
    assert lines[0].split()[:2] == ["host", "readings"] and lines[2].startswith("worker")
    result = json.loads((tmp_path / "pair" / "stress.json").read_text())
    assert result["verdict"]["result"] == "FAIL"
    worker = result["pair"]["hosts"]["worker"]
    assert worker["min_available_gib"] == 0.25 and worker["swap_peak_gib"] == 2.0
    assert result["pair"]["hosts"]["head"]["min_available_gib"] == 29.0
    assert worker["readings"] >= 2  # about once a second over a run of several seconds

    monkeypatch.setenv("CLUSTER_WATCH_PORT", str(free_port()))
    code = stress(shared_server, tmp_path / "alone")
    captured = capsys.readouterr()
    assert code == 0, captured
    notes = [line for line in captured.err.splitlines() if "pair watch" in line]
    assert len(notes) == 1 and notes[0].endswith("judging this host alone")
    assert captured.out.strip().startswith("PASS")
    result = json.loads((tmp_path / "alone" / "stress.json").read_text())
    assert result["pair"]["error"].startswith("the pair watch at 127.0.0.1:")


def start_watch(tmp: Path, rank: int, port: int, pid: int) -> subprocess.Popen[str]:
    """A real pair watch on the loopback interface, watching process `pid`."""
    argv = watch_argv(pid, rank, LOOPBACK, LOOPBACK, port, tmp / f"watch-{rank}.json")
    return subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)


@pytest.mark.e2e
def test_stress_reads_both_hosts_from_a_real_pair_of_watches(
    shared_server: VllmServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    served = subprocess.Popen(["sleep", "300"])  # what the watches guard: stands for vLLM
    watches = [start_watch(tmp_path, rank, port, served.pid) for rank in (0, 1)]
    try:
        wait_joined(tmp_path / "watch-0.json", watches)
        for name, value in pair_env(port).items():
            monkeypatch.setenv(name, value)
        code = stress(shared_server, tmp_path / "real")
    finally:
        for watch in watches:
            watch.terminate()
        served.kill()
        for process in (*watches, served):
            process.wait(timeout=30)
    captured = capsys.readouterr()
    assert code == 0, captured
    hosts = json.loads((tmp_path / "real" / "stress.json").read_text())["pair"]["hosts"]
    for host in ("head", "worker"):  # both watches read this machine's memory
        assert hosts[host]["readings"] >= 1
        assert 0 < hosts[host]["min_available_gib"] < 1024
