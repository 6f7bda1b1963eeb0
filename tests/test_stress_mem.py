"""sparkserve stress (scripts/stress_mem.sh): the pure parts, then runs against real vLLM CPU
servers: a clean run (outputs, sampling rate), a memory hog that must flip the verdict to FAIL
at its moment, Ctrl-C, bad input before any load, and a server stopped mid-run."""

from __future__ import annotations

import csv
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sparkserve.cli import main
from sparkserve.guard import Trip, write_marker
from sparkserve.stress import metrics
from sparkserve.stress.cli import guard_stop
from sparkserve.stress.plan import PlanError, default_bank, parse_bank, size_phases
from sparkserve.stress.sampler import GIB, MemorySampler, Sample, host_figures, read_meminfo
from sparkserve.stress.verdict import GuardStop, judge
from support.cpu_launch import launcher_server
from support.vllm_server import VllmServer, free_port

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- pure parts ----------------------------------------------------------------------------
def test_default_bank_is_1_2_3_and_one_over_max_num_seqs() -> None:
    assert default_bank(3) == [1, 2, 3, 4]
    assert default_bank(8) == [1, 2, 3, 9]
    assert default_bank(1) == [1, 2, 3]


@pytest.mark.parametrize("text", ["", "0", "1,x", "2,,3", "1,1", "-1", "1.5", "2000", " , "])
def test_bad_bank_is_one_clear_line(text: str) -> None:
    with pytest.raises(PlanError) as info:
        parse_bank(text)
    message = str(info.value)
    assert repr(text) in message and "whole numbers from 1 to 1024" in message
    assert "\n" not in message


def test_bank_parses() -> None:
    assert parse_bank("1, 2,4") == [1, 2, 4]


def test_phases_fill_the_pool_within_max_model_len() -> None:
    # The design note's Spark: 421,888-token pool, 262,144 max-model-len, MAX_NUM_SEQS 3.
    phases = size_phases([1, 2, 3, 4], pool_tokens=421_888, max_model_len=262_144, gen_tokens=2048)
    per_request = [p.prompt_tokens + p.gen_tokens for p in phases]
    assert per_request == [262_144, 210_944, 140_630, 105_472]
    for phase, total in zip(phases, per_request, strict=True):
        assert total <= 262_144
        assert phase.concurrency == 1 or phase.concurrency * total >= 421_888
    fixed = size_phases([2], pool_tokens=None, max_model_len=4096, gen_tokens=8, prompt_tokens=100)
    assert (fixed[0].prompt_tokens, fixed[0].gen_tokens) == (100, 8)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"pool_tokens": 1000, "max_model_len": 4096, "gen_tokens": 0}, "--gen-tokens"),
        ({"pool_tokens": None, "max_model_len": None, "gen_tokens": 8}, "--pool-tokens"),
        ({"pool_tokens": 100, "max_model_len": 4096, "gen_tokens": 90}, "16 tokens"),
        (
            {"pool_tokens": 9, "max_model_len": 4096, "gen_tokens": 8, "prompt_tokens": 5000},
            "max_model_len 4096",
        ),
        ({"pool_tokens": 1000, "max_model_len": 4096, "gen_tokens": 8, "fill": 0}, "--fill"),
    ],
)
def test_bad_sizes(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(PlanError, match=needle):
        size_phases([1], **kwargs)  # type: ignore[arg-type]


def _samples(avail: list[float], swap: list[float] | None = None) -> list[Sample]:
    swap = swap or [0.0] * len(avail)
    return [
        Sample(i / 10, a, 10.0, s, 0.0, 0.0, phase="idle" if i == 0 else f"c={1 + i // 3}")
        for i, (a, s) in enumerate(zip(avail, swap, strict=True))
    ]


def test_verdict_pass() -> None:
    verdict = judge(_samples([30, 25, 20, 22]), os_reserve_gib=14)
    assert verdict.passed and verdict.line.startswith("PASS")
    assert verdict.min_available_gib == 20 and verdict.worst_t == pytest.approx(0.2)


def test_verdict_fail_names_the_lowest_moment() -> None:
    verdict = judge(_samples([30, 20, 12, 9, 13, 25]), os_reserve_gib=14)
    assert not verdict.passed
    assert verdict.worst_t == pytest.approx(0.3) and verdict.worst_phase == "c=2"
    assert "9.00 GiB" in verdict.line and "t=0.3 s" in verdict.line and "c=2" in verdict.line


def test_verdict_fail_on_swap_growth_and_tolerance() -> None:
    samples = _samples([30, 30, 30, 30], swap=[1.0, 1.0, 1.5, 1.2])
    verdict = judge(samples, os_reserve_gib=14)
    assert not verdict.passed and "swap grew by 512 MiB" in verdict.line
    assert verdict.worst_t == pytest.approx(0.2)
    assert judge(samples, os_reserve_gib=14, swap_tolerance_gib=0.6).passed
    assert judge(_samples([30, 30], swap=[2.0, 1.0]), os_reserve_gib=14).passed  # shrank
    assert not judge([], os_reserve_gib=14).passed


def test_verdict_names_a_guard_stop(tmp_path: Path) -> None:
    samples = _samples([30, 25, 20, 22])  # memory looked fine to the sampler
    verdict = judge(samples, os_reserve_gib=14, guard_stop=GuardStop(0.25, "PSI at 55 %"))
    assert not verdict.passed and verdict.worst_phase == "c=1"
    assert verdict.line == (
        "FAIL: the memory guard stopped vLLM at t=0.2 s (during c=1): PSI at 55 %; "
        "lowest MemAvailable 20.00 GiB"
    )
    # The guard's own record, as guard.py writes it, placed on the run's clock.
    record = tmp_path / "hf" / "sparkserve" / "guard-stopped.json"
    write_marker(record, Trip("MemAvailable 1.00 GiB fell below", 1.0, 2.0, 0.0, 0.0, 1000.5), 7)
    assert guard_stop(None, {"HF_HOME": str(tmp_path / "hf")}, 990.0) == GuardStop(
        10.5, "MemAvailable 1.00 GiB fell below"
    )
    assert guard_stop(record, {}, 1001.0) is None  # an older stop than this run
    assert guard_stop(None, {}, 990.0) is None and guard_stop(tmp_path / "x", {}, 0.0) is None


def test_pool_size_from_metrics_and_log() -> None:
    text = (
        'vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="1024",'
        'kv_cache_size_tokens="59918"} 1.0\n'
    )
    assert metrics.cache_pool_tokens(metrics.parse(text)) == 59918
    older = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0\n'
    assert metrics.cache_pool_tokens(metrics.parse(older)) == 1600
    assert metrics.cache_pool_tokens({}) is None
    log = "INFO [kv_cache_utils.py:1147] GPU KV cache size: 421,888 tokens, Maximum ..."
    assert metrics.pool_tokens_from_log(log) == 421_888
    assert metrics.pool_tokens_from_log("CPU KV cache size: 59,918 tokens") == 59918


def test_host_figures_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal: 8388608 kB\nMemFree: 1048576 kB\nMemAvailable: 4194304 kB\n"
        "Buffers: 0 kB\nCached: 2097152 kB\nSReclaimable: 0 kB\n"
        "SwapTotal: 2097152 kB\nSwapFree: 1048576 kB\n"
    )
    assert host_figures(read_meminfo(meminfo)) == (8.0, 4.0, 5.0, 1.0)


def test_sampler_keeps_its_rate_while_this_process_is_busy() -> None:
    """It samples in a process of its own: this one holding the GIL in long C calls (as
    building big prompts and parsing streams under memory pressure did) does not slow it."""
    sampler = MemorySampler(20.0, nvidia_smi=None).start()
    sampler.phase("busy")
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        blob = b"\x01" * (256 << 20)  # one C call: the GIL is held until it returns
        del blob
    samples = sampler.stop()
    span = samples[-1].t - samples[0].t
    assert (len(samples) - 1) / span >= 18
    assert max(b.t - a.t for a, b in itertools.pairwise(samples)) < 0.15
    assert {s.phase for s in samples[1:]} == {"busy"}
    psi = [s.psi_full_pct for s in samples[1:]]
    assert all(p is None for p in psi) or all(0 <= p <= 100 for p in psi if p is not None)


# -- against a real server -----------------------------------------------------------------
def mem_available_gib() -> float:
    return read_meminfo()["MemAvailable"] / GIB


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
def test_stress_passes_and_samples_at_its_rate(
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
    assert sampling["achieved_hz"] >= 0.9 * 10, sampling
    times = [float(r["t"]) for r in csv.DictReader((out / "stress.csv").open())]
    assert max(b - a for a, b in itertools.pairwise(times)) < 0.35
    phases = {p["name"]: p for p in result["phases"]}
    assert list(phases) == ["c=1", "c=3"]
    for phase in phases.values():
        assert phase["complete"]
        assert all(r["completion_tokens"] == 48 for r in phase["requests"])
        assert all(r["prompt_tokens"] == 1500 for r in phase["requests"])
    assert any(r["kv_usage"] not in ("", None) for r in csv.DictReader((out / "stress.csv").open()))


def _start_stress_until_first_level(argv: list[str]) -> tuple[subprocess.Popen[str], list[str]]:
    """Start a stress run and return once it reports its first level (with the stderr so far)."""
    stress = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert stress.stderr is not None
    lines: list[str] = []
    for line in stress.stderr:
        lines.append(line)
        if line.startswith("[stress] c=1:"):
            break
    return stress, lines


def _hog(size: int, hold_s: float) -> str:
    return (
        "import sys, time\n"
        f"b = bytearray({size})\n"
        "b[::4096] = b'\\x01' * len(range(0, len(b), 4096))\n"
        "print(time.time(), flush=True)\n"
        f"time.sleep({hold_s})\n"
        "print(time.time(), flush=True)\n"
    )


@pytest.mark.e2e
def test_a_memory_hog_flips_the_verdict_to_fail_at_its_moment(
    shared_server: VllmServer, tmp_path: Path
) -> None:
    available = mem_available_gib()
    if available < 5:
        pytest.skip(f"only {available:.1f} GiB available: too little to start a 2 GiB hog")
    hog_bytes = 2 * 1024**3
    reserve = available - 1.0  # the hog takes 2 GiB: MemAvailable must fall under this
    out = tmp_path / "hog"
    stress, lines = _start_stress_until_first_level(
        [sys.executable, "-m", "sparkserve", *stress_argv(
            shared_server, out, "--bank", "1,2", "--prompt-tokens", "512", "--gen-tokens",
            "400", "--os-reserve-gb", f"{reserve:.3f}",
        )]
    )  # fmt: skip
    time.sleep(0.5)
    started = time.time()
    hog = subprocess.run(
        [sys.executable, "-c", _hog(hog_bytes, 2.0)], capture_output=True, text=True, check=True
    )
    exited = time.time()  # the hog's memory is back once its process is gone
    touched, _ = (float(x) for x in hog.stdout.split())
    stdout, stderr = stress.communicate(timeout=240)
    assert stress.returncode == 1, "".join(lines) + stderr + stdout
    assert stdout.startswith("FAIL: MemAvailable fell to")
    result = _check_outputs(out)
    verdict = result["verdict"]
    worst_epoch = result["t0_epoch"] + verdict["worst_t"]
    # the worst moment lies in the hog's life; not necessarily after its last page was touched:
    # touching 2 GiB can take over a second on a loaded machine, and other processes move
    # MemAvailable by tens of MiB meanwhile
    assert started <= worst_epoch <= exited + 0.3, (started, touched, worst_epoch, exited)
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
        (["--sample-hz", "2"], "bad --sample-hz '2'"),
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


def test_server_down_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code = main(["stress", "--url", url, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("sparkserve stress: server not usable:") and url in err
    assert "connection refused" in err and "\n" not in err
    assert not (tmp_path / "x").exists()


def test_os_reserve_comes_from_the_knob(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OS_RESERVE_GB", "2")  # under the knob's minimum of 4
    code = main(["stress", "--url", f"http://127.0.0.1:{free_port()}"])
    assert code == 2  # the knob's own rule refuses it before the server is tried


@pytest.mark.e2e
def test_server_stopped_mid_run_keeps_what_was_measured(
    tiny_models: dict[str, str], sparkserve_site: Path, tmp_path: Path
) -> None:
    server = launcher_server(tmp_path / "srv", "dflash", tiny_models, sparkserve_site).start()
    try:
        server.wait_healthy(timeout_s=300)
        out = tmp_path / "stopped"
        stress, _ = _start_stress_until_first_level(
            [sys.executable, "-m", "sparkserve", *stress_argv(
                server, out, "--bank", "1,2", "--prompt-tokens", "512", "--gen-tokens",
                "3000", "--os-reserve-gb", "0.5",
            )]
        )  # fmt: skip
        time.sleep(1.5)
        stopper = threading.Thread(target=server.stop, kwargs={"timeout_s": 30})
        stopper.start()
        stdout, stderr = stress.communicate(timeout=120)
        stopper.join()
    finally:
        server.stop(timeout_s=30)
    assert stress.returncode == 3, stdout + stderr
    assert "requests failed during c=1" in stderr
    assert stdout.startswith("partial run:")
    result = _check_outputs(out)
    assert result["status"] == "ERROR" and "c=1" in result["error"]
    phase = result["phases"][0]
    assert phase["name"] == "c=1" and not phase["complete"]
    assert phase["requests"][0]["error"]
    assert result["sampling"]["samples"] >= 10
    assert os.path.getsize(out / "stress.csv") > 0
