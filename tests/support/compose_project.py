"""Run the repository's real docker-compose.yml on the real Docker Engine (Compose v2) for a test.

`./scripts/test.sh` starts a Docker Engine of the suite's own (scripts/lib/docker_engine.sh:
private data root and socket, never the system's daemon), links the pinned Compose v2 as its
CLI plugin, loads the `cpu` image podman built, and exports DOCKER_HOST, DOCKER_CONFIG and
SPARKSERVE_CPU_IMAGE. A project has its own name (containers, network and volumes are named
after it), its own `.env` and an optional override file holding the test-only layer;
`remove()` takes everything of it away.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

from support.vllm_server import free_port

REPO = Path(__file__).resolve().parents[2]


class ComposeError(RuntimeError):
    """A compose or docker command failed, or a container did not get where it should."""


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise ComposeError(f"docker {' '.join(args)}: {done.stderr.strip()[-2000:]}")
    return done


def docker_time(stamp: str) -> datetime:
    """A time from `docker inspect` (RFC 3339 with nanoseconds) as an aware datetime."""
    head, _, rest = stamp.partition(".")
    fraction = rest.rstrip("Z")[:6] if rest else "0"
    return datetime.fromisoformat(f"{head}.{fraction:0<6}+00:00")


def never_started(state: dict) -> bool:
    """Docker's State of a container that was created and never run."""
    return bool(state["Status"] == "created" and state["StartedAt"].startswith("0001-"))


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

    def unset_env(self, *names: str) -> None:
        """Take knobs out of .env: compose then passes none of them (the image's default)."""
        for name in names:
            self.env.pop(name, None)
        self.write_env()

    def files(self) -> list[Path]:
        files = [REPO / "docker-compose.yml"]
        if self.override is not None:
            path = self.work / "compose.test.yml"
            path.write_text(yaml.safe_dump(self.override))
            files.append(path)
        return files

    def compose_env(self) -> dict[str, str]:
        """Compose's own variables naming this project, for a plain `docker compose` that a
        script of the repository runs (as `-p`, `-f`, `--profile` and `--env-file` would)."""
        return {
            "COMPOSE_PROJECT_NAME": self.name,
            "COMPOSE_FILE": os.pathsep.join(map(str, self.files())),
            "COMPOSE_PROFILES": ",".join(self.profiles),
            "COMPOSE_ENV_FILES": str(self.env_file),
        }

    def compose(
        self, *args: str, timeout: float = 300, check: bool = True
    ) -> subprocess.CompletedProcess:
        files = [arg for path in self.files() for arg in ("-f", str(path))]
        profiles = [arg for p in self.profiles for arg in ("--profile", p)]
        argv = ["docker", "compose", "-p", self.name, "--env-file", str(self.env_file), *files,
                *profiles, *args]  # fmt: skip
        # Compose reads knobs from the .env file only: none leaks in from the test's shell.
        env = {k: v for k, v in os.environ.items() if k not in self.env}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=REPO)  # fmt: skip
        if check and done.returncode != 0:
            raise ComposeError(f"docker compose {' '.join(args)}: {done.stderr.strip()[-2000:]}")
        return done

    def up(
        self, service: str, wait_s: float | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        """`up -d [--wait] SERVICE` on a port free right now (PORT in .env): the suite runs
        other servers, and a port picked minutes earlier may be taken by then. With wait_s,
        Compose returns once the service is healthy by Docker's own healthcheck schedule (or
        fails when it exits, turns unhealthy or a dependency fails)."""
        self.write_env(PORT=str(free_port()))
        wait = [] if wait_s is None else ["--wait", "--wait-timeout", str(int(wait_s))]
        timeout = 300 if wait_s is None else wait_s + 120
        return self.compose("up", "-d", "--no-build", *wait, service, timeout=timeout,
                            check=check)  # fmt: skip

    def volume(self, name: str) -> str:
        return f"{self.name}_{name}"

    def volume_path(self, name: str) -> Path:
        """The host folder of a named volume, created empty (with Compose's labels, so Compose
        takes it as its own) if missing. The test runs as root, as dockerd does."""
        volume = self.volume(name)
        if docker("volume", "inspect", volume, check=False).returncode != 0:
            docker("volume", "create", "--label", f"com.docker.compose.project={self.name}",
                   "--label", f"com.docker.compose.volume={name}", volume)  # fmt: skip
        mount = docker("volume", "inspect", "--format", "{{.Mountpoint}}", volume).stdout
        return Path(mount.strip())

    def container(self, service: str) -> str:
        done = docker(
            "ps", "-a", "--filter", f"label=com.docker.compose.project={self.name}",
            "--filter", f"label=com.docker.compose.service={service}",
            "--format", "{{.Names}}",
        )  # fmt: skip
        names = done.stdout.split()
        if len(names) != 1:
            raise ComposeError(f"service {service}: expected one container, found {names}")
        return names[0]

    def inspect(self, service: str) -> dict:
        return dict(json.loads(docker("inspect", self.container(service)).stdout)[0])

    def state(self, service: str) -> dict:
        return dict(self.inspect(service)["State"])

    def restarts(self, service: str) -> int:
        """How often Docker's restart policy has restarted the service's container."""
        return int(self.inspect(service)["RestartCount"])

    def logs(self, service: str) -> str:
        """Everything the container printed, over all of its restarts."""
        done = docker("logs", self.container(service), check=False)
        return done.stdout + done.stderr

    def wait_for_log(self, service: str, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            log = self.logs(service)
            if text in log:
                return log
            time.sleep(1)
        raise ComposeError(f"{service}: {text!r} not in its log after {timeout_s:.0f} s:\n"
                           f"{self.logs(service)[-4000:]}")  # fmt: skip

    def wait_for_restarts(self, service: str, count: int, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (seen := self.restarts(service)) >= count:
                return seen
            time.sleep(0.5)
        raise ComposeError(f"{service}: fewer than {count} restarts after {timeout_s:.0f} s")

    def down(self) -> float:
        started = time.monotonic()
        self.compose("down", timeout=120)
        return time.monotonic() - started

    def remove(self) -> None:
        """Containers, network and volumes of the project, whatever state they are in."""
        with contextlib.suppress(ComposeError, subprocess.TimeoutExpired):
            self.compose("down", "--volumes", timeout=180)
        for kind in ("volume", "network"):
            names = docker(kind, "ls", "--format", "{{.Name}}", check=False).stdout.split()
            for name in names:
                if name.startswith(f"{self.name}_"):
                    docker(kind, "rm", "-f", name, check=False)
