"""`sparkserve stress` against the run's real vLLM CPU servers (conftest.py): a PASS at its
sampling rate, a memory hog that flips the verdict, Ctrl-C, bad input before any load, and
(last: it stops the second server) a server stopped mid-run."""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkserve.cli import main
from sparkserve.client import metrics
from sparkserve.memory.host import GIB
from support.memory_cgroup import memory_cgroup
from support.vllm_server import VllmServer

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def stress_argv(server: VllmServer, out: Path, *extra: str) -> list[str]:
    return [
        "stress", "--url", server.base_url, "--out", str(out), "--settle-s", "0.5",
        "--progress-s", "1", *extra,
    ]  # fmt: skip


def _check_outputs(out: Path) -> dict:
    result = json.loads((out / "stress.json").read_text())
    with (out / "stress.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == result["sampling"]["samples"] > 0
    assert float(rows[0]["mem_available_gib"]) > 0
    assert (out / "stress.png").read_bytes()[:8] == PNG_MAGIC
    return result


@pytest.mark.e2e
def test_stress_passes_and_samples_through_the_run(
    shared_server: VllmServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = main(
        stress_argv(
            shared_server, out, "--bank", "1,3", "--prompt-tokens", "1500", "--gen-tokens",
            "48", "--os-reserve-gb", "0.5", "--sample-hz", "10",
        )
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured
    assert captured.out.strip().startswith("PASS")
    assert "[stress] c=3" in captured.err  # progress
    result = _check_outputs(out)
    assert result["status"] == "PASS" and result["verdict"]["result"] == "PASS"
    assert result["pool_tokens"] and result["max_model_len"] == 4096
    sampling = result["sampling"]
    # Sampled through the run, in time order (the rate a busy machine allows is
    # benchmarks/sampler_rate.py's figure, not this test's verdict).
    times = [float(r["t"]) for r in csv.DictReader((out / "stress.csv").open())]
    assert sampling["samples"] == len(times) >= 2 and sampling["requested_hz"] == 10, sampling
    assert all(a < b for a, b in itertools.pairwise(times))
    phases = {p["name"]: p for p in result["phases"]}
    assert list(phases) == ["c=1", "c=3"]
    for phase in phases.values():
        assert phase["complete"]
        assert all(r["completion_tokens"] == 48 for r in phase["requests"])
        assert all(r["prompt_tokens"] == 1500 for r in phase["requests"])
    assert any(r["kv_usage"] not in ("", None) for r in csv.DictReader((out / "stress.csv").open()))


def _start_stress_until_first_level(
    argv: list[str], preexec: Callable[[], None] | None = None
) -> tuple[subprocess.Popen[str], list[str]]:
    """Start a stress run and return once it reports its first level (with the stderr so far);
    `preexec` runs in its process first (a memory cgroup to join)."""
    stress = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec
    )
    assert stress.stderr is not None
    lines: list[str] = []
    for line in stress.stderr:
        lines.append(line)
        if line.startswith("[stress] c=1:"):
            break
    return stress, lines


def _hog(below_gib: float, cap_gib: float) -> str:
    """A process that takes memory in 64 MiB steps until MemAvailable (its cgroup's headroom
    where that is less) is below `below_gib` (whatever other processes free or take
    meanwhile), at most `cap_gib`; then it holds it until its stdin closes. It prints the time
    it got there and the GiB it holds."""
    return (
        "import sys, time\n"
        "from sparkserve.memory.host import read_meminfo\n"
        "def available():\n"
        "    return read_meminfo().available\n"
        "step, held = 64 << 20, []\n"
        f"while available() > {below_gib} * 2**30 and len(held) * step < {cap_gib} * 2**30:\n"
        "    b = bytearray(step)\n"
        "    b[::4096] = b'\\x01' * len(range(0, step, 4096))\n"
        "    held.append(b)\n"
        "print(time.time(), len(held) * step / 2**30, flush=True)\n"
        "sys.stdin.read()\n"
    )


def _low_reported(line: str) -> float | None:
    """The lowest MemAvailable a stress progress line reports ("... (low 3.98 GiB)"), or None."""
    found = re.search(r"\(low ([0-9.]+)", line) if line.startswith("[stress]") else None
    return float(found.group(1)) if found else None


@pytest.mark.e2e
@pytest.mark.memory_hog
def test_a_memory_hog_flips_the_verdict_to_fail_at_its_moment(
    shared_server: VllmServer, tmp_path: Path
) -> None:
    # The stress run and the hog share a memory cgroup of their own (4 GiB): the hog fills
    # that, not the host, and the tests of the other process cannot move its verdict.
    # The order holds on a machine of any speed: the hog is at its level before the stress run
    # starts and lets go only once a progress line of the run reports the low it caused, with
    # the run's idle and second level still to come.
    with memory_cgroup(4 * GIB) as cgroup:
        available = cgroup.headroom() / GIB
        # The OS reserve is 1.5 GiB below what is available now; the hog takes memory until
        # it is 0.5 GiB below the reserve.
        reserve = available - 1.5
        out = tmp_path / "hog"
        started = time.time()
        hog = subprocess.Popen(
            [sys.executable, "-c", _hog(reserve - 0.5, available - 1.0)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=cgroup.preexec,
        )  # fmt: skip
        assert hog.stdin is not None and hog.stdout is not None
        reached, held_gib = (float(x) for x in hog.stdout.readline().split())
        stress = subprocess.Popen(
            [sys.executable, "-m", "sparkserve", *stress_argv(
                shared_server, out, "--bank", "1,2", "--prompt-tokens", "512", "--gen-tokens",
                "400", "--os-reserve-gb", f"{reserve:.3f}", "--settle-s", "4",
            )],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=cgroup.preexec,
        )  # fmt: skip
        assert stress.stderr is not None
        lines: list[str] = []
        for line in stress.stderr:
            lines.append(line)
            low = _low_reported(line)
            if low is not None and low < reserve:
                break
        hog.stdin.close()  # the hog lets go
        hog.wait(timeout=60)
        exited = time.time()  # the hog's memory is back once its process is gone
        stdout, stderr = stress.communicate(timeout=240)
    held = f"the hog held {held_gib:.2f} GiB from {reached:.1f} to {exited:.1f}\n"
    assert stress.returncode == 1, held + "".join(lines) + stderr + stdout
    assert "c=2:" in stderr, "the run went on after the hog let go"
    assert stdout.startswith("FAIL: MemAvailable fell to")
    result = _check_outputs(out)
    verdict = result["verdict"]
    worst_epoch = result["t0_epoch"] + verdict["worst_t"]
    # the worst moment lies in the hog's life; not necessarily after it reached its level:
    # other processes move MemAvailable by tens of MiB meanwhile
    assert started <= worst_epoch <= exited + 0.3, (started, reached, worst_epoch, exited)
    assert verdict["min_available_gib"] < reserve
    assert result["status"] == "FAIL"


@pytest.mark.e2e
def test_sigint_writes_partial_results(shared_server: VllmServer, tmp_path: Path) -> None:
    out = tmp_path / "sigint"
    stress, _ = _start_stress_until_first_level(
        [str(REPO / "scripts" / "stress_mem.sh"), *stress_argv(
            shared_server, out, "--bank", "1,2", "--prompt-tokens", "512", "--gen-tokens",
            "3000", "--os-reserve-gb", "0.5",
        )[1:]]
    )  # fmt: skip
    time.sleep(1.5)
    stress.send_signal(signal.SIGINT)
    stdout, stderr = stress.communicate(timeout=60)
    assert stress.returncode == 130, stderr
    assert stdout.startswith("partial run: PASS")
    result = _check_outputs(out)
    assert result["status"] == "INTERRUPTED"
    assert [p["name"] for p in result["phases"]] == ["c=1"]
    assert not result["phases"][0]["complete"]
    # The server is fine afterwards (the interrupted request was dropped).
    assert shared_server.request("/v1/models")["data"][0]["id"]


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--model", "no-such-model"], "model 'no-such-model' is not served by"),
        (["--bank", "1,zero"], "bad --bank '1,zero'"),
        (["--sample-hz", "2"], "--sample-hz='2': must be a number of at least 5"),
    ],
    ids=["wrong-model", "nonsense-bank", "slow-sampling"],
)
def test_bad_input_fails_before_any_load(
    shared_server: VllmServer, tmp_path: Path, argv: list[str], needle: str
) -> None:
    before = metrics.total(shared_server.metrics(), metrics.PREFIX_QUERIES)
    done = subprocess.run(
        [sys.executable, "-m", "sparkserve", *stress_argv(shared_server, tmp_path / "x", *argv)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "x").exists()
    assert metrics.total(shared_server.metrics(), metrics.PREFIX_QUERIES) == before


@pytest.mark.e2e
def test_server_stopped_mid_run_keeps_what_was_measured(
    second_server: VllmServer, tmp_path: Path
) -> None:
    """Stops the run's second server (the last test to use it: conftest.py)."""
    server = second_server
    out = tmp_path / "stopped"
    stress, _ = _start_stress_until_first_level(
        [sys.executable, "-m", "sparkserve", *stress_argv(
            server, out, "--bank", "1,2", "--prompt-tokens", "512", "--gen-tokens",
            "3000", "--os-reserve-gb", "0.5",
        )]
    )  # fmt: skip
    time.sleep(1.5)
    # SIGTERM, and SIGKILL after docker stop's default 10 s: with the run's stream open, vLLM
    # 0.32's HTTP server stays up until the SIGKILL (a 30 s grace kept this test 30 s longer).
    stopper = threading.Thread(target=server.stop, kwargs={"timeout_s": 10})
    stopper.start()
    try:
        stdout, stderr = stress.communicate(timeout=120)
    finally:
        stopper.join()
    assert stress.returncode == 3, stdout + stderr
    assert stdout.startswith("partial run:")
    result = _check_outputs(out)
    # The phase the stop hit: c=1 when its stream was cut, c=2 when vLLM drained c=1's request
    # to its end first (a quiet machine) and c=2 then found no server. Either way the phases
    # before it are kept complete and the run ends at the failed one.
    *before, stopped = result["phases"]
    assert result["status"] == "ERROR"
    assert f"requests failed during {stopped['name']}" in stderr
    assert stopped["name"] in result["error"] and not stopped["complete"]
    assert any(request["error"] for request in stopped["requests"])
    assert all(phase["complete"] for phase in before)
    # Sampled across the run up to the stop, at whatever rate a busy machine allowed.
    assert result["sampling"]["samples"] >= 2
    assert os.path.getsize(out / "stress.csv") > 0
