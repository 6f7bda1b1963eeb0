"""The memory guard: its rules, its cost, its exit, the launcher's refusal after a stop, and
a real vLLM CPU server (started through mtp_serve.sh, which starts the guard itself) stopped
when a memory hog pushes MemAvailable under a floor set from this machine's current state."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_stress_mem import _start_stress_until_first_level

from sparkserve.guard import Limits, SwapRate, check, check_reason, next_wait
from sparkserve.guard_textfile import GuardState, render
from sparkserve.memory.host import GIB, read_meminfo
from sparkserve.memory.pressure import StallRate, parse_pressure, read_pressure
from support.cpu_launch import launcher_server
from support.vllm_server import metric_sum, parse_metrics, tail

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO / "src"))


def guard_process(pid: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sparkserve.guard", "--pid", str(pid), *extra],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_rules() -> None:
    limits = Limits(floor_bytes=2 * GIB, swap_rate_bytes_s=100e6)
    assert check(limits, 3 * GIB, 0, 0.0) is None
    assert "fell below the floor 2.00 GiB" in (check(limits, GIB, 0, 0.0) or "")
    assert "swap-out at 150 MB/s" in (check(limits, 3 * GIB, GIB, 150e6) or "")
    assert check(Limits(2 * GIB, 0), 3 * GIB, GIB, 1e12) is None  # swap check off
    rate = SwapRate(window_s=2.0)
    assert rate.add(0.0, 0) == 0.0
    assert rate.add(2.0, 100_000) == pytest.approx(100_000 * 4096 / 2.0)


def test_pressure_rule_reader_and_off_value(tmp_path: Path) -> None:
    limits = Limits(floor_bytes=GIB, swap_rate_bytes_s=0, psi_full_pct=40)
    assert check(limits, 3 * GIB, 0, 0.0, psi_full=39.9) is None
    rule, reason = check_reason(limits, 3 * GIB, 0, 0.0, psi_full=40.0) or ("", "")
    assert rule == "psi" and "PSI full avg10) at 40.0 % reached 40 % (GUARD_PSI_PCT)" in reason
    assert check(Limits(GIB, 0, psi_full_pct=0), 3 * GIB, 0, 0.0, psi_full=100.0) is None
    assert check(limits, 3 * GIB, 0, 0.0, psi_full=None) is None  # a kernel without PSI
    assert (check_reason(limits, GIB // 2, 0, 0.0, psi_full=90.0) or ("",))[0] == "mem_available"
    text = (
        "some avg10=12.50 avg60=3.00 avg300=1.00 total=4000000\n"
        "full avg10=7.25 avg60=1.00 avg300=0.50 total=1500000\n"
    )
    pressure = parse_pressure(text)
    assert (pressure.some_avg10, pressure.full_avg10, pressure.full_total_us) == (
        12.5,
        7.25,
        1500000,
    )
    with pytest.raises(ValueError, match="not a PSI file"):
        parse_pressure("some avg10=x total=1\n", "/proc/pressure/memory")
    stalls = StallRate()
    assert stalls.add(10.0, pressure) == (0.0, 0.0)
    later = parse_pressure(text.replace("total=4000000", "total=4500000"))
    assert stalls.add(11.0, later) == pytest.approx((0.5, 0.0))
    here = read_pressure()  # this machine's kernel: a real file or None, never an error
    (tmp_path / "memory").write_text("no pressure here\n")
    assert read_pressure(tmp_path / "memory") is None  # the guard keeps its other rules
    assert here is None or 0 <= here.full_avg10 <= 100


def test_polling_speeds_up_as_memory_falls_towards_the_floor() -> None:
    assert next_wait(0.2, 10 * GIB, 2 * GIB, 0.0) == 0.2  # not falling
    assert next_wait(0.2, 10 * GIB, 2 * GIB, GIB) == 0.2  # 8 s away
    assert next_wait(0.2, 3 * GIB, 2 * GIB, 5 * GIB) == pytest.approx(0.1)  # 0.2 s away
    assert next_wait(0.2, 2 * GIB + 1, 2 * GIB, 8 * GIB) == 0.01


def test_state_file_is_prometheus_text() -> None:
    state = GuardState(2 * GIB, 14 * GIB, 256e6, 40.0, mem_available_bytes=5 * GIB)
    state.psi_full_avg10, state.tripped, state.trip_time = 3.5, "psi", 1700000000.25
    parsed = parse_metrics(render(state, now=1700000001.0))
    assert metric_sum(parsed, "sparkserve_guard_floor_bytes") == 2 * GIB
    assert metric_sum(parsed, "sparkserve_guard_os_reserve_bytes") == 14 * GIB
    assert metric_sum(parsed, "sparkserve_guard_tripped", reason="psi") == 1
    assert metric_sum(parsed, "sparkserve_guard_tripped", reason="mem_available") == 0
    assert metric_sum(parsed, "sparkserve_guard_last_trip_timestamp_seconds") == 1700000000.25
    assert metric_sum(parsed, "sparkserve_guard_psi_full_avg10_percent") == 3.5
    state.psi_full_avg10 = None  # no PSI on this kernel: no such series, not a fake 0
    assert "psi_full_avg10" not in render(state)


def test_guard_exits_when_the_process_does_and_costs_under_1_percent(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    guard = guard_process(
        sleeper.pid, "--floor-gb", "0.5", "--swap-mb-s", "0", "--textfile-dir", str(tmp_path)
    )
    try:
        time.sleep(1.5)  # past the interpreter's start
        assert guard.poll() is None, guard.stderr.read() if guard.stderr else ""
        t0, c0 = time.monotonic(), cpu_seconds(guard.pid)
        time.sleep(6)
        share = (cpu_seconds(guard.pid) - c0) / (time.monotonic() - t0)
        print(f"guard CPU: {100 * share:.2f}% of one core over 6 s at 5 samples/s")
        assert share < 0.01
        state = parse_metrics((tmp_path / "guard.prom").read_text())
        assert metric_sum(state, "sparkserve_guard_watching") == 1
        assert metric_sum(state, "sparkserve_guard_floor_bytes") == GIB // 2
        sleeper.kill()
        sleeper.wait()
        gone = time.monotonic()
        guard.wait(timeout=5)
        print(f"guard exited {time.monotonic() - gone:.2f} s after its process")
    finally:
        sleeper.kill()
        guard.kill()
        guard.wait()
    assert guard.returncode == 0
    assert "watching pid" in (guard.stderr.read() if guard.stderr else "")
    state = parse_metrics((tmp_path / "guard.prom").read_text())
    assert metric_sum(state, "sparkserve_guard_watching") == 0  # it says it stopped watching
    assert metric_sum(state, "sparkserve_guard_tripped") == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--floor-gb", "lots"], "--floor-gb='lots': must be from 0.1 to 1024"),
        (["--swap-mb-s", "-1"], "--swap-mb-s='-1': must be from 0 to 100000"),
        (["--interval-s", "0"], "--interval-s='0': must be from 0.05 to 10"),
    ],
)
def test_bad_input_is_one_line(args: list[str], expected: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sparkserve.guard", "--pid", str(os.getpid()), *args],
        env=ENV, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sparkserve guard: "), done.stderr
    assert expected in lines[0]


def fake_vllm(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A launcher environment whose `vllm` only records that it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ran = tmp_path / "vllm-ran"
    (bin_dir / "vllm").write_text(f"#!/bin/sh\necho $$ > {ran}\n")
    (bin_dir / "vllm").chmod(0o755)
    env = dict(ENV, PATH=f"{bin_dir}:{os.environ['PATH']}", OS_RESERVE_GB="4")
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", VLLM_TARGET_DEVICE="cpu")
    return env, ran


def test_launcher_refuses_after_a_guard_stop_until_resumed(tmp_path: Path) -> None:
    env, ran = fake_vllm(tmp_path)
    record = tmp_path / "hf" / "sparkserve" / "guard-stopped.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"reason": "MemAvailable 1.00 GiB fell below the floor"}))
    launcher = str(REPO / "serve.sh")
    done = subprocess.run([launcher], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "the memory guard stopped vLLM last time" in lines[0]
    assert "fell below the floor" in lines[0] and "GUARD_RESUME=1" in lines[0]
    assert not ran.exists()

    done = subprocess.run(
        [launcher], env=dict(env, GUARD_RESUME="1"), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "clearing the memory guard record" in done.stderr
    assert ran.exists() and not record.exists()


def test_launcher_can_run_without_the_guard(tmp_path: Path) -> None:
    env, ran = fake_vllm(tmp_path)
    done = subprocess.run(
        [str(REPO / "mtp_serve.sh")], env=dict(env, GUARD="0"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert ran.exists() and "sparkserve guard" not in done.stderr


# ---------------------------------------------------------------- a fast hog


def test_a_fast_hog_is_stopped_right_after_it_crosses_the_floor(tmp_path: Path) -> None:
    """benchmarks/guard_reaction.py, one run: the watched process itself eats memory as fast as
    it can; the guard must SIGTERM it soon after MemAvailable crosses the floor. Prints how low
    MemAvailable got and the time from the first reading under the floor to the SIGTERM."""
    if read_meminfo().available < 10 * GIB:
        pytest.skip("under 10 GiB available: too little for the benchmark's 6 GiB hog")
    out = tmp_path / "reaction.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "guard_reaction.py"), "--runs", "1",
         "--json", str(out)],
        env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    run = json.loads(out.read_text())["runs"][0]
    assert "fell below the floor" in (run["reason"] or ""), run["guard_log"]
    # Negative when the guard read MemAvailable under the floor while the hog was still
    # inside the chunk it samples after.
    assert run["first_below_to_sigterm_ms"] is not None, run
    assert run["first_below_to_sigterm_ms"] < 1000
    state = parse_metrics(run["state_file"])
    assert metric_sum(state, "sparkserve_guard_tripped", reason="mem_available") == 1


# ---------------------------------------------------------------- a real server

HOG = """
import sys, time
floor, cap = int(sys.argv[1]), int(sys.argv[2])
margin, chunk = 512 << 20, 64 << 20
def available():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
chunks, held, crossed = [], 0, None
def grow(target):
    global held, crossed
    while held < cap and available() >= target:
        chunks.append(b"\\x01" * chunk)  # allocated and written: every page touched
        held += chunk
        if crossed is None and available() < floor:
            crossed = time.time()
grow(floor - margin)
print(f"crossed={crossed is not None} at={crossed or 0:.3f} held={held}", flush=True)
end = time.time() + 60
while time.time() < end:  # stay under the floor while other jobs on the machine come and go
    grow(floor - margin // 2)
    time.sleep(0.05)
"""
KV_BYTES = 192 * 1024 * 1024
STOP_LINE = re.compile(r"stopping vLLM \(pid (\d+)\): (.*) \(at ([\d.]+)\)")


@pytest.mark.e2e
def test_guard_stops_a_real_server_under_memory_pressure(
    tiny_models: dict[str, str], sparkserve_site: Path, cpu_venv_python: str, tmp_path: Path
) -> None:
    # The floor leaves room for the server itself (about 2 GiB here) and for other jobs on
    # this shared machine: 5 GiB under what is available now.
    before = read_meminfo().available
    floor_gib = round(max(1.0, (before - 5 * GIB) / GIB), 2)
    knobs = {
        "GUARD_FLOOR_GB": str(floor_gib),
        "EXTRA_ARGS": f"--kv-cache-memory-bytes {KV_BYTES}",
    }
    server = launcher_server(tmp_path, "mtp", tiny_models, sparkserve_site, knobs).start()
    hog = stress = None
    record = Path(tmp_path / "hf" / "sparkserve" / "guard-stopped.json")
    try:
        server.wait_healthy(timeout_s=300)
        assert server.proc is not None
        # A stress run is under way when the guard acts: its verdict must say so.
        stress, _ = _start_stress_until_first_level(
            [sys.executable, "-m", "sparkserve", "stress", "--url", server.base_url,
             "--out", str(tmp_path / "stress"), "--bank", "1,2,3,4", "--prompt-tokens", "512",
             "--gen-tokens", "3500", "--os-reserve-gb", "0.5", "--settle-s", "0.5",
             "--guard-record", str(record)]
        )  # fmt: skip
        guard_pids = [
            p.name for p in Path("/proc").iterdir()
            if p.name.isdigit()
            and f"sparkserve.guard --pid {server.proc.pid} " in _cmdline(p)
        ]  # fmt: skip
        assert len(guard_pids) == 1, "the launcher did not start exactly one guard"
        now = read_meminfo().available
        need = now - int(floor_gib * GIB)
        print(f"available {before / GIB:.2f} -> {now / GIB:.2f} GiB with the server up; "
              f"floor {floor_gib} GiB; the hog needs {need / GIB:.2f} GiB")  # fmt: skip
        assert 0 < need < 8 * GIB, "this machine's memory moved too much to run the test"
        hog = subprocess.Popen(
            [sys.executable, "-c", HOG, str(int(floor_gib * GIB)), str(need + 3 * GIB)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert hog.stdout is not None
        report = hog.stdout.readline()
        server.proc.wait(timeout=60)
        exited = time.time()
        verdict, stress_err = stress.communicate(timeout=120)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        if stress is not None:
            stress.kill()
            stress.wait()
        server.stop(timeout_s=30)
    log = server.log_path.read_text(errors="replace")
    assert "crossed=True" in report, report
    crossed = float(re.search(r"at=([\d.]+)", report).group(1))  # type: ignore[union-attr]
    stop = STOP_LINE.search(log)
    assert stop, tail(server.log_path)
    assert int(stop.group(1)) == server.proc.pid
    assert "fell below the floor" in stop.group(2)
    detected = float(stop.group(3)) - crossed
    print(f"hog crossed the floor; guard acted {detected:.2f} s later; vLLM gone "
          f"{exited - crossed:.2f} s after the crossing")  # fmt: skip
    assert detected < 2.0
    # vLLM aborts its requests and ends its engine processes (which hold the memory) at the
    # SIGTERM; with the stress run's stream still open its HTTP server then waits for that
    # connection to close, until the guard's SIGKILL after the grace period.
    assert "vLLM (pid" in log and ("exited after SIGTERM" in log or "SIGKILL after" in log)
    assert "API server: engine client stopped" in log
    assert json.loads(record.read_text())["reason"].startswith("MemAvailable")
    print("stress:", verdict.strip())
    assert stress.returncode == 1, verdict + stress_err
    assert verdict.startswith("FAIL: the memory guard stopped vLLM at t=")
    assert "(during c=" in verdict and "fell below the floor" in verdict
    result = json.loads((tmp_path / "stress" / "stress.json").read_text())
    assert result["status"] == "FAIL" and "requests failed during c=" in (result["error"] or "")
    deadline = time.monotonic() + 3
    while any(_running(p) for p in guard_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(p) for p in guard_pids), "the guard outlived vLLM"
    # The third planner config: this server's logged pool (MTP, prefix cache, 192 MiB).
    from test_plan import cpu_plans, logged_pool

    predicted = cpu_plans(
        cpu_venv_python,
        {"mtp-prefix": {"target": tiny_models["target"], "method": "mtp", "n": 2,
                        "kv_bytes": KV_BYTES, "prefix": True}},
    )  # fmt: skip
    print("pool predicted:", predicted, "logged:", logged_pool(server.log_path))
    assert predicted["mtp-prefix"] == logged_pool(server.log_path)


def _running(pid: str) -> bool:
    """Alive and not a zombie (an exited child its new parent has not reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
