"""The memory guard: its rules, its state file, its exit, and the launcher's refusal after a stop
(a real server under memory pressure: tests/e2e/test_guard_under_pressure.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sparkserve.guard.keeper import HUNG_AFTER_S, RESTARTS
from sparkserve.guard.monitor import Limits, SwapRate, check, check_reason, next_wait
from sparkserve.guard.textfile import GuardState, render
from sparkserve.memory.host import GIB, read_meminfo
from support.memory_cgroup import memory_cgroup
from support.promises import GUARD_HUNG_S, GUARD_REACTION_S, GUARD_RESTART_S
from support.vllm_server import metric_sum, parse_metrics

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(REPO / "src"))
HANG_S = 60.0  # a guard against a hang, not a speed target


def guard_process(pid: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sparkserve.guard.monitor", "--pid", str(pid), *extra],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_rules() -> None:
    limits = Limits(floor_bytes=2 * GIB, swap_rate_bytes_s=100e6)
    assert check(limits, 3 * GIB, 0, 0.0) is None
    assert "fell below the floor 2.00 GiB" in (check(limits, GIB, 0, 0.0) or "")
    assert "swap-out at 150 MB/s" in (check(limits, 3 * GIB, GIB, 150e6) or "")
    assert check(Limits(2 * GIB, 0), 3 * GIB, GIB, 1e12) is None  # swap check off
    rate = SwapRate(window_s=2.0)
    assert rate.add(0.0, 0) == 0.0
    assert rate.add(2.0, 400_000_000) == pytest.approx(200e6)  # bytes written to swap


def test_pressure_rule_and_off_value() -> None:
    limits = Limits(floor_bytes=GIB, swap_rate_bytes_s=0, psi_full_pct=40)
    assert check(limits, 3 * GIB, 0, 0.0, psi_full=39.9) is None
    rule, reason = check_reason(limits, 3 * GIB, 0, 0.0, psi_full=40.0) or ("", "")
    assert rule == "psi" and "PSI full avg10) at 40.0 % reached 40 % (GUARD_PSI_PCT)" in reason
    assert check(Limits(GIB, 0, psi_full_pct=0), 3 * GIB, 0, 0.0, psi_full=100.0) is None
    assert check(limits, 3 * GIB, 0, 0.0, psi_full=None) is None  # a kernel without PSI
    assert (check_reason(limits, GIB // 2, 0, 0.0, psi_full=90.0) or ("",))[0] == "mem_available"


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


def test_guard_watches_and_exits_when_the_process_does(tmp_path: Path) -> None:
    """Its state file says it watches while the process runs, and that it stopped watching once
    the process is gone, when it exits 0 by itself (its CPU cost: benchmarks/guard_cost.py)."""
    sleeper = subprocess.Popen(["sleep", "60"])
    guard = guard_process(
        sleeper.pid, "--floor-gb", "0.5", "--swap-mb-s", "0", "--textfile-dir", str(tmp_path)
    )
    state_file = tmp_path / "guard.prom"
    try:
        deadline = time.monotonic() + HANG_S
        while not state_file.exists() and guard.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert guard.poll() is None, guard.stderr.read() if guard.stderr else ""
        state = parse_metrics(state_file.read_text())
        assert metric_sum(state, "sparkserve_guard_watching") == 1
        assert metric_sum(state, "sparkserve_guard_floor_bytes") == GIB // 2
        sleeper.kill()
        sleeper.wait()
        guard.wait(timeout=HANG_S)
    finally:
        sleeper.kill()
        guard.kill()
        guard.wait()
    assert guard.returncode == 0
    assert "watching pid" in (guard.stderr.read() if guard.stderr else "")
    state = parse_metrics(state_file.read_text())
    assert metric_sum(state, "sparkserve_guard_watching") == 0  # it says it stopped watching
    assert metric_sum(state, "sparkserve_guard_tripped") == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--floor-gb", "lots"], "--floor-gb='lots': must be a number from 0.5 to 64"),
        (["--swap-mb-s", "-1"], "--swap-mb-s='-1': must be a number from 0 to 100000"),
        (["--interval-s", "0"], "--interval-s='0': must be a number from 0.05 to 10"),
    ],
)
def test_bad_input_is_one_line(args: list[str], expected: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sparkserve.guard.monitor", "--pid", str(os.getpid()), *args],
        env=ENV, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sparkserve guard: "), done.stderr
    assert expected in lines[0]


# The launcher's status when vLLM ends by itself with status 0, as the fake below does.
ENDED_BY_ITSELF = 1


def fake_vllm(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A launcher environment whose `vllm` only records that it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ran = tmp_path / "vllm-ran"
    (bin_dir / "vllm").write_text(f"#!/bin/sh\necho $$ > {ran}\n")
    (bin_dir / "vllm").chmod(0o755)
    env = dict(ENV, PATH=f"{bin_dir}:{os.environ['PATH']}", OS_RESERVE_GB="4")
    env.update(
        HF_HOME=str(tmp_path / "hf"), HF_OFFLINE="1", VLLM_TARGET_DEVICE="cpu", HOST="127.0.0.1"
    )  # a host run beyond loopback needs API_KEY
    # checkpoints already on disk: the launcher's fetch step has nothing to download
    for knob in ("MODEL", "DRAFT_MODEL"):
        folder = tmp_path / knob.lower()
        folder.mkdir()
        env[knob] = str(folder)
    # the launcher's own state (GUARD_RESUME spent or not), as a fresh container has it
    env["SPARKSERVE_STATE_DIR"] = str(tmp_path / "state")
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
    assert done.returncode == ENDED_BY_ITSELF, done.stderr  # the fake vLLM exits at once
    assert "clearing the memory guard record" in done.stderr
    assert ran.exists() and not record.exists()

    # GUARD_RESUME=1 is spent: the same container restarted never clears a later record.
    ran.unlink()
    record.write_text(json.dumps({"reason": "a later trip"}))
    done = subprocess.run(
        [launcher], env=dict(env, GUARD_RESUME="1"), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "GUARD_RESUME=1 was spent on this container's first start" in line
    assert "a later trip" in line and record.exists() and not ran.exists()


def test_launcher_can_run_without_the_guard(tmp_path: Path) -> None:
    env, ran = fake_vllm(tmp_path)
    done = subprocess.run(
        [str(REPO / "mtp_serve.sh")], env=dict(env, GUARD="0"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == ENDED_BY_ITSELF, done.stderr
    assert ran.exists() and "sparkserve guard" not in done.stderr


def _guard_of(keeper: psutil.Process, other_than: int | None) -> psutil.Process | None:
    for child in keeper.children():
        if "sparkserve.guard.monitor" in child.cmdline() and child.pid != other_than:
            return child
    return None


def _wait_watching(state_file: Path, since: float, deadline: float) -> float:
    """When the guard's state file first says `watching 1`, written after `since` (epoch)."""
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            state = parse_metrics(state_file.read_text())
            written = metric_sum(state, "sparkserve_guard_updated_timestamp_seconds")
            if written > since and metric_sum(state, "sparkserve_guard_watching") == 1:
                return written
        time.sleep(0.02)
    raise AssertionError(f"no guard wrote `watching 1` into {state_file}")


def test_a_killed_guard_is_replaced_and_one_that_keeps_dying_stops_vllm(tmp_path: Path) -> None:
    """serve.sh with a `vllm` that sleeps: the launcher's keeper replaces a guard killed with
    SIGKILL (a new one writes its state within the promised bound) and, at the guard's death
    past its restart budget, stops the process it guards within the same bound."""
    env, _ = fake_vllm(tmp_path)
    (tmp_path / "bin" / "vllm").write_text("#!/bin/sh\nexec sleep 300\n")
    state_file = tmp_path / "hf" / "sparkserve" / "metrics" / "guard.prom"
    launcher = subprocess.Popen(
        [str(REPO / "serve.sh")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    served = psutil.Process(launcher.pid)  # the launcher; vLLM (here: sleep) its child
    restarts: list[float] = []
    try:
        _wait_watching(state_file, 0.0, time.monotonic() + HANG_S)
        (keeper,) = [p for p in served.children() if "sparkserve.guard.keeper" in p.cmdline()]
        guard = _guard_of(keeper, None)
        assert guard is not None and "sleep" in [p.name() for p in served.children()]
        for _ in range(RESTARTS):
            killed = time.time()
            guard.send_signal(signal.SIGKILL)
            restarts.append(_wait_watching(state_file, killed, time.monotonic() + HANG_S) - killed)
            guard = _guard_of(keeper, guard.pid)
            assert guard is not None and launcher.poll() is None
        killed = time.time()
        guard.send_signal(signal.SIGKILL)  # one death past the budget: vLLM must not run on
        launcher.wait(timeout=HANG_S)
        stopped = time.time() - killed
        keeper.wait(timeout=HANG_S)
    finally:
        launcher.kill()
        launcher.wait()
    log = launcher.stderr.read() if launcher.stderr else ""
    print(f"guard SIGKILL to a new guard's state: {', '.join(f'{s:.2f}' for s in restarts)} s; "
          f"the last SIGKILL to vLLM's exit: {stopped:.2f} s")  # fmt: skip
    assert max(restarts) < GUARD_RESTART_S, restarts
    # the stand-in has no API server: its SIGKILL ends the launcher's wait (status 137)
    assert launcher.returncode != 0 and stopped < GUARD_RESTART_S, (launcher.returncode, log)
    assert log.count("was killed by SIGKILL while vLLM") == RESTARTS, log
    assert f"its {RESTARTS + 1}th death in 600 s; stopping vLLM" in log
    assert "exited after SIGTERM" in log
    state = parse_metrics(state_file.read_text())
    assert metric_sum(state, "sparkserve_guard_watching") == 0  # it says nothing watches


def test_a_hung_guard_is_killed_and_replaced(tmp_path: Path) -> None:
    """A guard that is alive but takes no readings (here SIGSTOPped: as one stuck in a read
    or starved) protects nothing: its keeper kills it after HUNG_AFTER_S and a new guard is
    watching within the promised bound; vLLM runs on."""
    env, _ = fake_vllm(tmp_path)
    (tmp_path / "bin" / "vllm").write_text("#!/bin/sh\nexec sleep 300\n")
    state_file = tmp_path / "hf" / "sparkserve" / "metrics" / "guard.prom"
    launcher = subprocess.Popen(
        [str(REPO / "serve.sh")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    served = psutil.Process(launcher.pid)
    try:
        _wait_watching(state_file, 0.0, time.monotonic() + HANG_S)
        (keeper,) = [p for p in served.children() if "sparkserve.guard.keeper" in p.cmdline()]
        hung = _guard_of(keeper, None)
        assert hung is not None
        stopped_at = time.time()
        hung.send_signal(signal.SIGSTOP)
        replaced = _wait_watching(state_file, stopped_at, time.monotonic() + HANG_S) - stopped_at
        new = _guard_of(keeper, hung.pid)
        assert new is not None and not hung.is_running()
        assert launcher.poll() is None and "sleep" in [p.name() for p in served.children()]
    finally:
        for process in [*served.children(recursive=True), served]:  # they hold its stderr
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        launcher.wait()
    log = launcher.stderr.read() if launcher.stderr else ""
    print(f"guard SIGSTOP to a new guard's state: {replaced:.2f} s")
    # not before the hang bound (its last reading came up to an interval, 0.2 s, before the
    # SIGSTOP: 1 s of slack), and within the promise
    assert HUNG_AFTER_S - 1.0 <= replaced < GUARD_HUNG_S, (replaced, log)
    assert f"(pid {hung.pid}) took no reading for {HUNG_AFTER_S:.0f} s (hung) and was killed " \
           "while vLLM" in log, log  # fmt: skip


# ---------------------------------------------------------------- a fast hog


@pytest.mark.memory_hog
def test_a_fast_hog_is_stopped_under_half_the_floor_at_once(tmp_path: Path) -> None:
    """benchmarks/guard_reaction.py, one run of its emergency rule: the watched process itself
    eats memory as fast as it can, through the floor and on; the guard must SIGTERM it within
    its promised reaction to MemAvailable crossing half the floor, without waiting out its
    danger window (60 s here). Prints how low MemAvailable got and the time from the first
    reading under half the floor to the SIGTERM. In a memory cgroup of its own (7.5 GiB, for a
    hog of up to 3 GiB): the hog fills that, and the other test process's servers cannot move
    its floor."""
    if read_meminfo().available < 9 * GIB:
        pytest.skip("under 9 GiB available: too little for the benchmark's 7.5 GiB cgroup")
    out = tmp_path / "reaction.json"
    with memory_cgroup(15 * GIB // 2) as cgroup:
        done = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "guard_reaction.py"), "--runs", "1",
             "--rule", "emergency", "--below-gib", "1.5", "--cap-gib", "3", "--json", str(out)],
            env=ENV, capture_output=True, text=True, timeout=300, preexec_fn=cgroup.preexec,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    run = json.loads(out.read_text())["runs"][0]
    assert "fell below half the floor" in (run["reason"] or ""), run["guard_log"]
    assert "danger: MemAvailable" in run["guard_log"]  # it crossed the floor first
    # Negative when the guard read MemAvailable under the level while the hog was still
    # inside the chunk it samples after.
    assert run["first_below_to_sigterm_ms"] is not None, run
    assert run["first_below_to_sigterm_ms"] < 1000 * GUARD_REACTION_S
    state = parse_metrics(run["state_file"])
    assert metric_sum(state, "sparkserve_guard_tripped", reason="mem_available") == 1
