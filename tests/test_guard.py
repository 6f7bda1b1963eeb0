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

from sparkserve.guard import Limits, SwapRate, check
from sparkserve.memory.host import GIB, read_meminfo
from support.cpu_launch import launcher_server
from support.vllm_server import tail

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
    assert rate.add(2.0, 400_000_000) == pytest.approx(200e6)  # bytes written to swap


def test_guard_exits_when_the_process_does_and_costs_under_1_percent() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    guard = guard_process(sleeper.pid, "--floor-gb", "0.5", "--swap-mb-s", "0")
    try:
        time.sleep(1.5)  # past the interpreter's start
        assert guard.poll() is None, guard.stderr.read() if guard.stderr else ""
        t0, c0 = time.monotonic(), cpu_seconds(guard.pid)
        time.sleep(6)
        share = (cpu_seconds(guard.pid) - c0) / (time.monotonic() - t0)
        print(f"guard CPU: {100 * share:.2f}% of one core over 6 s at 5 samples/s")
        assert share < 0.01
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
        "PREFIX_CACHE": "0",  # a config the run's two shared servers do not cover (for the plan)
        "EXTRA_ARGS": f"--kv-cache-memory-bytes {KV_BYTES}",
    }
    server = launcher_server(tmp_path, "mtp", tiny_models, sparkserve_site, knobs).start()
    hog = None
    try:
        server.wait_healthy(timeout_s=300)
        assert server.proc is not None
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
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
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
    assert "vLLM (pid" in log and "exited after SIGTERM" in log
    record = Path(tmp_path / "hf" / "sparkserve" / "guard-stopped.json")
    assert json.loads(record.read_text())["reason"].startswith("MemAvailable")
    deadline = time.monotonic() + 3
    while any(_running(p) for p in guard_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(p) for p in guard_pids), "the guard outlived vLLM"
    # The third planner config: this server's logged pool (MTP, no prefix cache, 192 MiB).
    from test_plan import cpu_plans, logged_pool

    predicted = cpu_plans(
        cpu_venv_python,
        {"mtp-no-prefix": {"target": tiny_models["target"], "method": "mtp", "n": 2,
                           "kv_bytes": KV_BYTES, "prefix": False}},
    )  # fmt: skip
    print("pool predicted:", predicted, "logged:", logged_pool(server.log_path))
    assert predicted["mtp-no-prefix"] == logged_pool(server.log_path)


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
