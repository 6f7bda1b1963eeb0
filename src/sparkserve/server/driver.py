"""Restarting the server with one knob changed: through compose for a deployment, or the
launcher itself for a server it started (the CPU test, a bare host). A driver knows the
setting the server runs with now, refuses a server that is not one of sparkserve's launchers'
(one line), and restarts it with a value, waiting until it answers /health.

A sparkserve server is told apart from any other vLLM by its environment: the launchers export
SPARK_LMHEAD_CALIBRATE to vLLM (vllm_command.vllm_env), the images set SPARKSERVE_IMAGE.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sparkserve.command_line import UsageError
from sparkserve.guard.monitor import marker_path
from sparkserve.knobs.registry import LAUNCHER_SCRIPTS, stop_grace_s

LAUNCHER_MARK = "SPARK_LMHEAD_CALIBRATE"  # in the environment of every launcher-started vLLM
IMAGE_MARK = "SPARKSERVE_IMAGE"  # in the environment of every sparkserve container
STOP_GRACE_S = float(stop_grace_s())  # docker-compose.yml's stop_grace_period (generated)


class NotSparkserve(UsageError):
    """The server to restart is not one a sparkserve launcher started."""


class RestartFailed(RuntimeError):
    """The server did not come back healthy with a value; the message says why (one line)."""


class Driver(Protocol):
    def knobs(self) -> dict[str, str]:
        """The knobs the running server was started with (as set: unset ones are absent)."""
        ...

    def restart(self, changes: Mapping[str, str | None], timeout_s: float) -> float:
        """Restart the server with `changes` over its knobs (None: the knob unset, as it was
        before a change); the seconds it took to be healthy; RestartFailed when it did not
        get there."""
        ...

    def guard_stop(self, hf_home: str, since_epoch: float) -> str | None:
        """The reason of a memory guard stop the server recorded after `since_epoch` (under
        `hf_home`, as the server sees it), made so that it does not block the next restart:
        that stop was the candidate's failure. An older record is not the tune's to clear."""
        ...


def applied(env: Mapping[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
    """`env` with `changes` over it; a change to None unsets the knob."""
    result = dict(env)
    for name, value in changes.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = value
    return result


def recorded_after(text: str, since_epoch: float) -> str | None:
    """The reason in a guard record's text when the stop came after `since_epoch`."""
    try:
        found = json.loads(text)
        at = float(found["at"])
    except (ValueError, KeyError, TypeError):
        return None
    return str(found.get("reason", "no reason recorded")) if at >= since_epoch else None


def wait_healthy(url: str, timeout_s: float, alive: object = None) -> None:
    """Poll URL/health until 200 within `timeout_s`; `alive` (a callable) False ends early."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(alive) and not alive():
            raise RestartFailed("the server exited before it answered /health")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RestartFailed(f"the server did not answer {url}/health within {timeout_s:.0f} s")


def process_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def vllm_environ(pid: int) -> dict[str, str]:
    """The environment of the vLLM a launcher runs: its `vllm serve` child's (the launcher
    exports the knobs' vLLM side there), or the pid's own when it is vLLM itself."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            words = (entry / "cmdline").read_bytes().split(b"\0")[:3]
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"serve" in words:
            return process_environ(int(entry.name))
    return process_environ(pid)


def _group_members(group: int) -> list[int]:
    """The live (not zombie) processes of a process group."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            members.append(int(entry.name))
    return members


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signum)


@dataclass
class LauncherDriver:
    """A server that serve.sh or mtp_serve.sh runs on this host, the launcher's pid in
    `pid_file` (vLLM is its child). A restart stops it (SIGTERM to its process group, SIGKILL
    after the grace) and starts the launcher again in a session of its own with the same
    environment and the changes, its output appended to `log`, and records the new pid."""

    launcher: str
    pid_file: Path
    url: str
    log: Path
    repo: Path
    _env: dict[str, str] = field(default_factory=dict, init=False)

    def _pid(self) -> int:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            raise UsageError(f"bad --pid-file {str(self.pid_file)!r}: holds no pid") from None

    def check(self) -> None:
        pid = self._pid()
        try:
            env = process_environ(pid)  # what the launcher was given: what a restart gets
            served = vllm_environ(pid)
        except OSError:
            raise UsageError(
                f"bad --pid-file {str(self.pid_file)!r}: no process {pid} is running"
            ) from None
        if LAUNCHER_MARK not in served:
            raise NotSparkserve(
                f"process {pid} is not a server of sparkserve's launchers (no {LAUNCHER_MARK} "
                "in its environment): tune restarts only servers serve.sh or mtp_serve.sh "
                "started"
            )
        self._env = env

    def knobs(self) -> dict[str, str]:
        if not self._env:
            self.check()
        return dict(self._env)

    def _stop(self, pid: int) -> None:
        """SIGTERM to the server's process group, SIGKILL after the grace; returns once every
        process of the group is gone (vLLM's engine holds the pool until it exits)."""
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return
        _signal_group(group, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while _group_members(group) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _group_members(group):
            _signal_group(group, signal.SIGKILL)
            while _group_members(group):
                time.sleep(0.1)

    def restart(self, changes: Mapping[str, str | None], timeout_s: float) -> float:
        env = applied(self.knobs(), changes)
        self._stop(self._pid())
        self._env = env
        started = time.monotonic()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            proc = subprocess.Popen(
                [str(self.repo / LAUNCHER_SCRIPTS[self.launcher])],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        # The launcher runs vLLM as its child and stays: its pid is the server's from now on.
        self.pid_file.write_text(f"{proc.pid}\n")
        wait_healthy(self.url, timeout_s, alive=lambda: proc.poll() is None)
        return time.monotonic() - started

    def guard_stop(self, hf_home: str, since_epoch: float) -> str | None:
        """The record is a file of this host: read, and removed when it is the candidate's."""
        record = marker_path(hf_home)
        try:
            reason = recorded_after(record.read_text(), since_epoch)
        except OSError:
            return None
        if reason is not None:
            record.unlink(missing_ok=True)
        return reason


@dataclass
class ComposeDriver:
    """A compose deployment's server service: a restart recreates its container with the
    changes in compose's environment (the shell wins over `.env`, docker-compose.yml passes
    each knob through) and waits for Docker's healthcheck (`up --wait`)."""

    service: str
    url: str
    project_dir: Path
    env_file: Path | None
    docker: str = "docker"
    _env: dict[str, str] = field(default_factory=dict, init=False)
    # A guard stop seen on the model volume: the next start clears its record (GUARD_RESUME=1,
    # the launcher's own way), as a named volume is out of this host's reach.
    _resume: bool = field(default=False, init=False)

    def _compose(
        self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        command = [self.docker, "compose", "--project-directory", str(self.project_dir)]
        if self.env_file is not None:
            command += ["--env-file", str(self.env_file)]
        try:
            return subprocess.run(
                [*command, *args], capture_output=True, text=True, timeout=timeout,
                env=dict(os.environ if env is None else env),
            )  # fmt: skip
        except FileNotFoundError:
            raise UsageError(f"--driver compose: no {self.docker!r} on PATH") from None

    def check(self) -> None:
        done = self._compose("ps", "--format", "json", self.service)
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        # Compose v2 prints one JSON object a line (2.21 and later) or one array (before)
        first = json.loads(lines[0]) if done.returncode == 0 and lines else []
        entries = first if isinstance(first, list) else [first]
        if not entries:
            why = (done.stderr.strip().splitlines() or ["not running"])[-1]
            raise UsageError(
                f"bad --service {self.service!r}: compose in {self.project_dir} runs no such "
                f"service ({why})"
            )
        container = str(entries[0].get("ID", ""))
        inspect = subprocess.run(
            [self.docker, "inspect", "--format", "{{json .Config.Env}}", container],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        items = json.loads(inspect.stdout or "[]") if inspect.returncode == 0 else []
        env = dict(item.split("=", 1) for item in items if "=" in item)
        if IMAGE_MARK not in env:
            raise NotSparkserve(
                f"service {self.service!r} is not a sparkserve container (no {IMAGE_MARK} in "
                "its environment): tune restarts only sparkserve's compose services"
            )
        self._env = env

    def knobs(self) -> dict[str, str]:
        if not self._env:
            self.check()
        return dict(self._env)

    def restart(self, changes: Mapping[str, str | None], timeout_s: float) -> float:
        started = time.monotonic()
        resume = {"GUARD_RESUME": "1"} if self._resume else {}
        done = self._compose(
            "up", "-d", "--force-recreate", "--wait", "--wait-timeout", str(int(timeout_s)),
            self.service, env={**applied(os.environ, changes), **resume},
            timeout=timeout_s + 60,
        )  # fmt: skip
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RestartFailed(f"docker compose up {self.service}: {why}")
        self._resume = False
        self._env = applied(self._env, changes)
        wait_healthy(self.url, 30)
        return time.monotonic() - started

    def guard_stop(self, hf_home: str, since_epoch: float) -> str | None:
        """The record lies on the service's model volume: read through its container (running
        or not, `docker cp`); a stop of the candidate's makes the next restart resume."""
        ids = self._compose("ps", "--all", "--quiet", self.service).stdout.split()
        if not ids:
            return None
        done = subprocess.run(
            [self.docker, "cp", f"{ids[0]}:{marker_path(hf_home)}", "-"],
            capture_output=True, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:  # no record there
            return None
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
            member = tar.next()
            data = tar.extractfile(member) if member is not None else None
            text = data.read().decode(errors="replace") if data is not None else ""
        reason = recorded_after(text, since_epoch)
        if reason is not None:
            self._resume = True
        return reason
