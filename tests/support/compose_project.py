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
import hashlib
import json
import os
import shutil
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
    head, _, rest = stamp.rstrip("Z").partition(".")
    fraction = rest[:6] if rest else "0"
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
    override_text: str | None = None  # the override as YAML, for Compose's own tags (`!reset`)
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

    def compose(
        self, *args: str, timeout: float = 300, check: bool = True
    ) -> subprocess.CompletedProcess:
        files = ["-f", str(REPO / "docker-compose.yml")]
        if self.override is not None or self.override_text is not None:
            path = self.work / "compose.test.yml"
            path.write_text(self.override_text or yaml.safe_dump(self.override))
            files += ["-f", str(path)]
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
        self, *services: str, wait_s: float | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        """`up -d [--wait] SERVICE...` on a port free right now (PORT in .env): the suite runs
        other servers, and a port picked minutes earlier may be taken by then. With wait_s,
        Compose returns once the service is healthy by Docker's own healthcheck schedule (or
        fails when it exits, turns unhealthy or a dependency fails)."""
        self.write_env(PORT=str(free_port()))
        wait = [] if wait_s is None else ["--wait", "--wait-timeout", str(int(wait_s))]
        timeout = 300 if wait_s is None else wait_s + 120
        return self.compose("up", "-d", "--no-build", *wait, *services, timeout=timeout,
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


def place_in_hf_cache(hub: Path, repo_id: str, files: Path) -> None:
    """A checkpoint in Hugging Face's cache layout, as `snapshot_download` leaves it."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    digest = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / digest
    shutil.copytree(files, snapshot, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".*"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(digest)


def install_shims(cpu_python: str, target: Path) -> Path:
    """The test-only vLLM fixes for the CPU (tests/cpu_shims), installed into target for a
    container to mount (they are never built into the image)."""
    subprocess.run(
        [cpu_python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(REPO / "tests" / "cpu_shims")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return target
