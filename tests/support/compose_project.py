"""Run the repository's real docker-compose.yml on the real Docker Engine (Compose v2) for a test.

`./scripts/test.sh` starts a Docker Engine of the suite's own (scripts/lib/docker_engine.sh:
private data root and socket, never the system's daemon), links the pinned Compose v2 as its
CLI plugin, loads the `cpu` image podman built under a tag of this checkout's own, and exports
DOCKER_HOST, DOCKER_CONFIG and SPARKSERVE_CPU_IMAGE (that tag; every project's override file
names it as the cpu services' image). A project has its own name (containers, network and
volumes are named after it), its own `.env` and an optional override file holding the
test-only layer; `remove()` takes everything of it away.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

from support.cpu_launch import SHARED_MODEL_INFOS
from support.vllm_server import free_port

REPO = Path(__file__).resolve().parents[2]
CPU_SERVICES = ("sparkserve-cpu", "sparkserve-cpu-fetch")  # docker-compose.yml's on the cpu image
# who docker-compose.yml runs every service as (user:, CACHE_UID:CACHE_GID unset): the owner
# of the model cache, never root
CACHE_OWNER = (1000, 1000)


class ComposeError(RuntimeError):
    """A compose or docker command failed, or a container did not get where it should."""


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise ComposeError(f"docker {' '.join(args)}: {done.stderr.strip()[-2000:]}")
    return done


def docker_time(stamp: str) -> datetime:
    """A time from `docker inspect` or `docker logs --timestamps` (RFC 3339 with nanoseconds)
    as an aware datetime."""
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

    def files(self) -> list[Path]:
        files = [REPO / "docker-compose.yml"]
        override = self.with_suite_image(self.override or {})
        if override or self.override_text is not None:
            path = self.work / "compose.test.yml"
            path.write_text(self.override_text or yaml.safe_dump(override))
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

    def script_env(self, **extra: str) -> dict[str, str]:
        """The environment of a repository script run from the host against this project:
        Compose's variables naming it, none of its knobs (they come from its .env), plus extra."""
        env = {k: v for k, v in os.environ.items() if k not in self.env}
        return {**env, **self.compose_env(), **extra}

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

    @staticmethod
    def with_suite_image(override: dict) -> dict:
        """The override, plus the cpu services' `image:` set to this run's own tag of the cpu
        image (SPARKSERVE_CPU_IMAGE; see suite_image_tag in scripts/lib/docker_engine.sh)."""
        image = os.environ.get("SPARKSERVE_CPU_IMAGE")
        if not image:
            return override
        services = dict(override.get("services", {}))
        for name in CPU_SERVICES:
            services[name] = {**services.get(name, {}), "image": image}
        return {**override, "services": services}

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

    def logged_at(self, service: str, text: str) -> float | None:
        """When (epoch seconds, Docker's own stamp) the container last printed a line holding
        `text`: the log's polling sees a line up to a second or more after it was written."""
        done = docker("logs", "--timestamps", self.container(service), check=False)
        stamps = [line.split(" ", 1)[0] for line in (done.stdout + done.stderr).splitlines()
                  if text in line]  # fmt: skip
        return docker_time(stamps[-1]).timestamp() if stamps else None

    def wait_for_log(self, service: str, text: str, timeout_s: float, seen: int = 0) -> str:
        """Wait until the log holds `text` more than `seen` times (its earlier lines stay in it
        across restarts and stops)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            log = self.logs(service)
            if log.count(text) > seen:
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

    def wait_healthy(self, service: str, timeout_s: float) -> float:
        """Wait until Docker's own healthcheck says `healthy`; returns the seconds it took."""
        started = time.monotonic()
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            state = self.state(service)
            if state.get("Health", {}).get("Status") == "healthy":
                return time.monotonic() - started
            time.sleep(0.5)
        raise ComposeError(f"{service}: not healthy after {timeout_s:.0f} s: {self.state(service)}"
                           f"\n{self.logs(service)[-4000:]}")  # fmt: skip

    def exit_codes(self, service: str, since: float) -> list[int]:
        """The exit codes of the service's container since a time.time(), from Docker's events
        (a restart clears State.ExitCode within 0.1 s, so polling it would miss them)."""
        done = docker(
            "events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}",
            "--filter", f"container={self.inspect(service)['Id']}", "--filter", "event=die",
            "--format", "{{.Actor.Attributes.exitCode}}",
        )  # fmt: skip
        return [int(code) for code in done.stdout.split()]

    def processes(self, service: str) -> dict[int, str]:
        """Every process of the service's running container below its init (pid: command
        line), from the host's /proc."""
        found: dict[int, str] = {}
        todo = [int(self.state(service)["Pid"])]
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                for task in Path(f"/proc/{pid}/task").iterdir():
                    for child in (task / "children").read_text().split():
                        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
                        found[int(child)] = cmdline.replace(b"\0", b" ").decode().strip()
                        todo.append(int(child))
        return found

    def down(self) -> float:
        started = time.monotonic()
        self.compose("down", timeout=120)
        return time.monotonic() - started

    def remove(self) -> None:
        """Containers, network and volumes of the project, whatever state they are in; and
        those of test runs that died before their teardown (remove_orphans)."""
        remove_orphans()
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
    own_as_the_cache_owner(hub.parent)


def seed_model_infos(cache: Path) -> None:
    """The model-class records of this run's vLLM servers (support/cpu_launch.py,
    SHARED_MODEL_INFOS) on a model-cache volume, where the container's vLLM looks for them
    (VLLM_CACHE_ROOT is under HF_HOME): its first start then skips inspecting each class in a
    process of its own, as a Spark's later starts do. vLLM takes a record only if it holds
    the hash of the image's own module (the image's vLLM and the test venv's are one build,
    patched alike). Not for the container test's volume: its first start is its cold one."""
    shared = Path(os.environ.get(SHARED_MODEL_INFOS, "") or "/nonexistent")
    records = sorted(shared.glob("*.json")) if shared.is_dir() else []
    if not records:
        return
    target = cache / "vllm" / "modelinfos"
    target.mkdir(parents=True, exist_ok=True)
    for record in records:
        shutil.copyfile(record, target / record.name)
    own_as_the_cache_owner(cache)


def own_as_the_cache_owner(cache: Path) -> None:
    """The whole cache owned by CACHE_OWNER, as a user's own ~/.cache/huggingface is (the test
    writes it as root): the services, running as that user, write it with no capability."""
    for folder, _, names in os.walk(cache):
        for path in (folder, *(os.path.join(folder, name) for name in names)):
            os.chown(path, *CACHE_OWNER, follow_symlinks=False)


def install_shims(cpu_python: str, target: Path) -> Path:
    """The test-only vLLM fixes for the CPU (tests/cpu_shims), installed into target for a
    container to mount (they are never built into the image)."""
    subprocess.run(
        [cpu_python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(REPO / "tests" / "cpu_shims")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    # readable by the container's user (not root): pytest makes its folders 0700
    for folder, _, names in os.walk(target):
        os.chmod(folder, 0o755)
        for name in names:
            os.chmod(os.path.join(folder, name), 0o644)
    return target


def reboot_docker_engine() -> subprocess.CompletedProcess:
    """scripts/lib/docker_engine.sh's reboot_docker_engine: the suite's dockerd stopped and
    started again, as a host reboot does; status 3 (and one line) when this test run is not
    the daemon's only user."""
    script = (f"source {REPO}/scripts/lib/venv.sh && source {REPO}/scripts/lib/docker_engine.sh"
              " && reboot_docker_engine")  # fmt: skip
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)


# The Docker modules run in parallel test processes on the suite's one daemon. The reboot check
# (test_container.py's test 8) restarts that daemon: it takes this run's daemon lock for itself,
# so it waits until no other module's containers run, and they wait while it restarts.
def daemon_lock(run_dir: Path) -> Path:
    """The lock file of this test run (run_dir: the folder every process's temp folder is in)."""
    return run_dir / "suite-docker-daemon.lock"


@contextlib.contextmanager
def sharing_the_daemon(lock: Path) -> Iterator[None]:
    """Held while a module's containers run on the daemon: no reboot meanwhile."""
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def daemon_to_myself(lock: Path, timeout_s: float) -> Iterator[float]:
    """The daemon with no other module's containers on it; yields the seconds waited for it."""
    started = time.monotonic()
    with lock.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - started > timeout_s:
                    raise TimeoutError(
                        f"other modules kept containers on the suite's daemon for {timeout_s:.0f} s"
                    ) from None
                time.sleep(1)
        try:
            yield time.monotonic() - started
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# The tests' project names end in the pid of the test process that owns them.
TEST_PROJECT = re.compile(r"sparkserve-(?:e2e|e2e-refusing|pair|fleet-(?:\d|router))-(\d+)")


def remove_orphans() -> None:
    """The projects of test processes that are gone (a run killed before its teardown): under
    `restart: unless-stopped` their containers would start again with every daemon start and
    serve on beside later runs."""
    labels = docker("ps", "-a", "--format", '{{.Label "com.docker.compose.project"}}',
                    check=False).stdout.split()  # fmt: skip
    for name in sorted(set(labels)):
        owner = TEST_PROJECT.fullmatch(name)
        if owner is None or Path(f"/proc/{owner.group(1)}").exists():
            continue
        ids = docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={name}",
                     check=False).stdout.split()  # fmt: skip
        if ids:
            docker("rm", "-f", *ids, check=False)
        for kind in ("network", "volume"):
            for item in docker(kind, "ls", "--format", "{{.Name}}", check=False).stdout.split():
                if item.startswith(f"{name}_"):
                    docker(kind, "rm", "-f", item, check=False)
