"""No secret on a command line or in a file a run writes: a serve.sh server on the CPU with
API_KEY and HF_TOKEN set to values of their own, and `sparkserve bench`, `llama-benchy`,
`verify` and `tune` run against it (verify and tune restart it through its launcher, which
hands both secrets on). Meanwhile every process's /proc/PID/cmdline is read every 50 ms; after,
every file under the test's folder (the server's logs, each tool's output and report) and each
tool's stdout and stderr are searched for both values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cpu_launch import cpu_python, launcher_server
from support.vllm_server import VllmServer, stop_group_of

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-closed49-Qv7tLr2mZx"  # distinctive: found only where it leaked
TOKEN = "hf_closed49Wp4sKe9dNa"
SECRETS = (KEY.encode(), TOKEN.encode())


class CmdlineWatch(threading.Thread):
    """Reads every process's command line until stopped; keeps those that hold a secret."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stopped = threading.Event()
        self.seen: dict[int, str] = {}
        self.rounds = 0
        self.processes: set[int] = set()

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            self.rounds += 1
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    argv = (entry / "cmdline").read_bytes()
                except OSError:
                    continue  # gone meanwhile
                self.processes.add(int(entry.name))
                if any(secret in argv for secret in SECRETS):
                    shown = argv.replace(SECRETS[0], b"<API_KEY>").replace(SECRETS[1], b"<HF>")
                    self.seen[int(entry.name)] = shown.replace(b"\0", b" ").decode(errors="replace")


@pytest.fixture(scope="module")
def keyed(
    tiny_models: dict[str, str], sparkserve_site: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[VllmServer, Path]]:
    work = tmp_path_factory.mktemp("secrets")
    knobs = {"API_KEY": KEY, "HF_TOKEN": TOKEN}
    server = launcher_server(work / "server", "dflash", tiny_models, sparkserve_site, knobs)
    server.start()
    pid_file = work / "server.pid"
    assert server.proc is not None
    pid_file.write_text(f"{server.proc.pid}\n")
    try:
        server.wait_healthy()
        yield server, work
    finally:
        server.stop(timeout_s=30)
        stop_group_of(pid_file)  # the launcher a tool started last


def tool(argv: list[str], work: Path) -> str:
    """Run one tool in `work` (a file it writes where it stands is searched too) with both
    secrets in its environment, as a user's .env gives them; its stdout and stderr."""
    env = {**os.environ, "API_KEY": KEY, "HF_TOKEN": TOKEN, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=2400, env=env, cwd=work)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


def test_no_secret_in_any_command_line_or_output(keyed: tuple[VllmServer, Path]) -> None:
    server, work = keyed
    url = server.base_url
    pid_file = str(work / "server.pid")
    prompts = work / "prompts.jsonl"
    line = "alpha beta gamma delta epsilon zeta eta theta "
    prompts.write_text("".join(json.dumps({"prompt": line * (6 + i)}) + "\n" for i in range(2)))
    watch = CmdlineWatch()
    watch.start()
    outputs = []
    try:
        # the watch sees a secret on a command line when there is one
        probe = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)", KEY])
        probe.wait()
        assert probe.pid in watch.seen, "the watch missed a key on a command line"
        del watch.seen[probe.pid]
        outputs.append(tool([
            str(REPO / "scripts" / "bench.sh"), "--url", url, "--out", str(work / "bench"),
            "--concurrency", "1", "--gen-tokens", "8", "--prefix-tokens", "300",
            "--ttft-rounds", "1",
        ], work))  # fmt: skip
        outputs.append(tool([
            cpu_python(), "-m", "sparkserve", "llama-benchy", "--url", url, "--profile", "short",
            "--depths", "0", "--concurrency", "1", "--runs", "1", "--corpus", "offline",
            "--out", str(work / "benchy"),
        ], work))  # fmt: skip
        outputs.append(tool([
            sys.executable, "-m", "sparkserve", "verify", "--driver", "launcher",
            "--launcher", "dflash", "--pid-file", pid_file, "--url", url,
            "--out", str(work / "verify"), "--checks", "api,prefix", "--gen-tokens", "8",
            "--healthy-timeout-s", "600",
        ], work))  # fmt: skip
        outputs.append(tool([
            sys.executable, "-m", "sparkserve", "tune", "draft", "--driver", "launcher",
            "--launcher", "dflash", "--pid-file", pid_file, "--url", url,
            "--out", str(work / "tune"), "--lengths", "0", "--prompts-file", str(prompts),
            "--api", "completions", "--gen-tokens", "16", "--healthy-timeout-s", "600",
        ], work))  # fmt: skip
    finally:
        watch.stopped.set()
        watch.join()
    assert watch.rounds > 100 and len(watch.processes) > 20, "the watch saw too little to judge"
    assert not watch.seen, f"a secret on a command line: {watch.seen}"
    for name, text in zip(("bench", "llama-benchy", "verify", "tune"), outputs, strict=True):
        assert KEY not in text and TOKEN not in text, f"a secret in {name}'s output"
    written = [path for path in work.rglob("*") if path.is_file()]
    for folder in ("bench", "benchy", "verify", "tune", "server"):
        assert any(folder in path.relative_to(work).parts for path in written), folder
    leaked = [
        str(path.relative_to(work))
        for path in written
        if any(secret in path.read_bytes() for secret in SECRETS)
    ]
    assert not leaked, f"a secret in {leaked}"
