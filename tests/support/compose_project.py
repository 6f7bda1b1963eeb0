"""Run the repository's real docker-compose.yml on podman (podman-compose) for a test.

`./scripts/test.sh` installs podman, builds the `cpu` image and a podman-compose venv, and
exports SPARKSERVE_CPU_IMAGE, SPARKSERVE_PODMAN_COMPOSE and CONTAINERS_CONF. A project has its
own name (containers, network and volumes are named after it), its own `.env` and an optional
override file holding the test-only layer; `remove()` takes everything of it away.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from support.vllm_server import free_port

REPO = Path(__file__).resolve().parents[2]


class ComposeError(RuntimeError):
    """A compose or podman command failed, or a container did not get where it should."""


def api_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise ComposeError(f"podman {' '.join(args)}: {done.stderr.strip()[-2000:]}")
    return done


@dataclass
class ComposeProject:
    name: str
    work: Path  # holds the project's .env and override file
    env: dict[str, str] = field(default_factory=dict)
    override: dict | None = None
    profiles: tuple[str, ...] = ("cpu",)

    @property
    def env_file(self) -> Path:
        return self.work / ".env"

    def write_env(self, **changes: str) -> None:
        """Set (or with an empty value, keep empty) knobs in the project's .env."""
        self.env.update(changes)
        self.work.mkdir(parents=True, exist_ok=True)
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in self.env.items()))

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        binary = os.environ["SPARKSERVE_PODMAN_COMPOSE"]
        files = ["-f", str(REPO / "docker-compose.yml")]
        if self.override is not None:
            path = self.work / "compose.test.yml"
            path.write_text(yaml.safe_dump(self.override))
            files += ["-f", str(path)]
        profiles = [arg for p in self.profiles for arg in ("--profile", p)]
        argv = [binary, "-p", self.name, "--env-file", str(self.env_file), *files, *profiles,
                *args]  # fmt: skip
        # Compose reads knobs from the .env file only: none leaks in from the test's shell.
        env = {k: v for k, v in os.environ.items() if k not in self.env}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=REPO)  # fmt: skip
        if done.returncode != 0:
            raise ComposeError(f"podman-compose {' '.join(args)}: {done.stderr.strip()[-2000:]}")
        return done

    def up(self, service: str) -> None:
        """`up -d SERVICE` on a port free right now (PORT in .env): the suite runs other
        servers, and a port picked minutes earlier may be taken by then."""
        self.write_env(PORT=str(free_port()))
        self.compose("up", "-d", service)

    def volume(self, name: str) -> str:
        return f"{self.name}_{name}"

    def volume_path(self, name: str) -> Path:
        """The host folder of a named volume (created empty if missing; podman runs as root)."""
        volume = self.volume(name)
        if podman("volume", "exists", volume, check=False).returncode != 0:
            podman("volume", "create", volume)
        mount = podman("volume", "inspect", "--format", "{{.Mountpoint}}", volume).stdout
        return Path(mount.strip())

    def container(self, service: str) -> str:
        done = podman(
            "ps", "-a", "--filter", f"label=com.docker.compose.project={self.name}",
            "--filter", f"label=com.docker.compose.service={service}",
            "--format", "{{.Names}}",
        )  # fmt: skip
        names = done.stdout.split()
        if len(names) != 1:
            raise ComposeError(f"service {service}: expected one container, found {names}")
        return names[0]

    def state(self, service: str) -> dict:
        inspected = json.loads(podman("inspect", self.container(service)).stdout)
        return inspected[0]["State"]

    def logs(self, service: str) -> str:
        done = podman("logs", self.container(service), check=False)
        return done.stdout + done.stderr

    def wait_healthy(self, service: str, timeout_s: float) -> float:
        """Seconds until the image's own healthcheck passes (`podman healthcheck run`: podman
        schedules none without systemd). It runs once the API answers /health on the
        published port: each run is a `podman exec`, too dear on 2 cores to poll with."""
        started = time.monotonic()
        url = f"http://127.0.0.1:{self.env['PORT']}/health"
        while time.monotonic() - started < timeout_s:
            if api_answers(url):
                name = self.container(service)
                if podman("healthcheck", "run", name, check=False).returncode == 0:
                    return time.monotonic() - started
            time.sleep(1)
        tail = self.logs(service)[-4000:]
        raise ComposeError(f"{service} not healthy after {timeout_s:.0f} s; log tail:\n{tail}")

    def wait_for_log(self, service: str, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            log = self.logs(service)
            if text in log:
                return log
            time.sleep(1)
        raise ComposeError(f"{service}: {text!r} not in its log after {timeout_s:.0f} s:\n"
                           f"{self.logs(service)[-4000:]}")  # fmt: skip

    def down(self) -> float:
        started = time.monotonic()
        self.compose("down", timeout=120)
        return time.monotonic() - started

    def remove(self) -> None:
        """Containers, network and volumes of the project, whatever state they are in."""
        with contextlib.suppress(ComposeError, subprocess.TimeoutExpired):
            self.compose("down", "--volumes", timeout=180)
        for kind in ("volume", "network"):
            names = podman(kind, "ls", "--format", "{{.Name}}", check=False).stdout.split()
            for name in names:
                if name.startswith(f"{self.name}_"):
                    podman(kind, "rm", "-f", name, check=False)
