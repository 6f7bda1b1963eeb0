"""`sparkserve doctor`: is this machine ready for a first `docker compose up`?

Checks what stops a first run on a DGX Spark: the GPU (GB10, compute capability 12.1),
Docker with GPU access and Compose v2, memory (vLLM refuses to start unless GPU_MEM of the
total is free), swap, free disk for the image and the weights, whether the model and the
drafter are already in the Hugging Face cache, the knobs in the environment, a record left by
the memory guard, and the API port. It runs anywhere: on a machine that is not a Spark it says
so and reports what it could still check. Prints a table (or --json); exits 1 on a blocker.

With CLUSTER_NODES=2 it also checks this node's end of the pair's link and, run on both
nodes at about the same time, meets the other node's doctor over the ports the engine uses
(docs/CLUSTER.md): reachability both ways, the same image and vLLM release, the same MTU.

With --fleet (on the router's host) it checks the replicas behind the router instead: the URLs
given, else ROUTER_WORKERS, each reached with API_KEY (from the environment or --env-file):
that each answers, and serves the same model with the same settings as the others; a row per
replica says ok or why not, and any that is not makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sparkserve.cluster.check_row import Check, Status
from sparkserve.cluster.identity import node_identity
from sparkserve.cluster.link_rows import link_rows
from sparkserve.cluster.preflight import Side, pair_rows
from sparkserve.command_line import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    fail,
    one_line_errors,
    ranged,
)
from sparkserve.doctor.fleet import ALL_CLEAR, fleet_rows, fleet_workers
from sparkserve.guard.monitor import marker_path
from sparkserve.knobs.registry import KnobError
from sparkserve.launch.dotenv import DotenvError, with_dotenv
from sparkserve.launch.settings import Settings, check_recipe_fits, resolve_settings
from sparkserve.memory.checkpoint import cache_dir_name, find_snapshot, hf_home
from sparkserve.memory.host import GIB, read_meminfo
from sparkserve.recipes import LAUNCHER_SCRIPTS, LAUNCHERS_HELP
from sparkserve.router.fleet import DEFAULT_TIMEOUT_S

SPARK_COMPUTE_CAP = "12.1"
DEFAULT_PAIR_WAIT_S = 60.0
# The image (~20 GB with CUDA 13 devel) plus the int4 target (~67 GiB) and the drafter.
DEFAULT_DISK_NEED_GB = 100.0
COMMAND_TIMEOUT_S = 10.0


def _command(argv: Sequence[str]) -> tuple[int, str]:
    """(exit status, stdout + stderr); 127 when the program is missing, 124 on a timeout."""
    if shutil.which(argv[0]) is None:
        return 127, f"{argv[0]}: not found"
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]}: no answer in {COMMAND_TIMEOUT_S:.0f} s"
    except OSError as error:
        return 126, f"{argv[0]}: {error.strerror}"
    return done.returncode, (done.stdout + done.stderr).strip()


def check_gpu() -> tuple[Check, bool]:
    """The GPU row and whether this is a Spark (a GPU of compute capability 12.1)."""
    query = ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"]
    code, out = _command(query)
    if code == 127:
        return Check("GPU", "skip", "no nvidia-smi: not a DGX Spark (or no NVIDIA driver)"), False
    if code != 0:
        return Check("GPU", "blocker", f"nvidia-smi failed ({code}): {out[:200]}"), False
    rows = [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line]
    if not rows or len(rows[0]) < 3:
        return Check("GPU", "blocker", f"nvidia-smi said {out[:200]!r}"), False
    name, cap, driver = rows[0][:3]
    if cap != SPARK_COMPUTE_CAP:
        return (
            Check(
                "GPU",
                "blocker",
                f"{name}, compute capability {cap}, driver {driver}: the "
                f"image is built for the Spark's GB10 (sm_121, capability {SPARK_COMPUTE_CAP})",
            ),
            False,
        )
    return Check("GPU", "ok", f"{name}, compute capability {cap}, driver {driver}"), True


def check_docker(spark: bool) -> tuple[list[Check], str | None]:
    """Docker client, engine, NVIDIA runtime and Compose v2; also the engine's data root."""
    missing: Status = "blocker" if spark else "info"
    code, out = _command(["docker", "info", "--format", "{{json .}}"])
    if code == 127:
        return [Check("Docker", missing, "no docker client on PATH")], None
    if code != 0:
        first = out.splitlines()[-1] if out else f"exit {code}"
        detail = f"client present, no engine reachable: {first[:200]}"
        return [Check("Docker", missing, detail)], None
    try:
        info: dict[str, Any] = json.loads(out.splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return [Check("Docker", "warn", f"docker info printed no JSON: {out[:200]}")], None
    checks = [Check("Docker", "ok", f"engine {info.get('ServerVersion', '?')}")]
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    cdi = [str(d) for d in info.get("CDISpecDirs") or [] if any(Path(d).glob("nvidia*"))]
    if "nvidia" in runtimes or cdi:
        checks.append(Check("Docker GPU", "ok", f"runtimes {', '.join(runtimes)}; CDI {cdi}"))
    else:
        checks.append(
            Check(
                "Docker GPU",
                missing,
                f"no nvidia runtime (runtimes: {', '.join(runtimes)}) "
                "and no NVIDIA CDI spec: install the NVIDIA Container Toolkit",
            )
        )
    code, out = _command(["docker", "compose", "version", "--short"])
    checks.append(
        Check("Docker Compose", "ok", f"v{out}")
        if code == 0
        else Check("Docker Compose", missing, f"`docker compose` (v2) not available: {out[:120]}")
    )
    return checks, info.get("DockerRootDir")


def check_memory(settings: Settings, spark: bool) -> list[Check]:
    mem = read_meminfo()
    values = settings.text
    want = settings.vllm_share_bytes(mem.total)
    rows = [
        Check(
            "memory",
            "ok" if not spark or mem.total > 100 * GIB else "warn",
            f"{mem.total / GIB:.1f} GiB total, {mem.available / GIB:.1f} GiB available",
        )
    ]
    problem = settings.budget_problem(mem.total)
    if problem is None:
        detail = f"GPU_MEM={values['GPU_MEM']} keeps OS_RESERVE_GB={values['OS_RESERVE_GB']}"
        rows.append(Check("memory budget", "ok", detail))
    else:  # the launcher refuses this on this machine
        rows.append(Check("memory budget", "blocker" if spark else "info", problem))
    if mem.available < want:
        status: Status = "blocker" if spark else "info"
        rows.append(
            Check(
                "memory free",
                status,
                f"vLLM wants GPU_MEM={values['GPU_MEM']} x {mem.total / GIB:.1f} = "
                f"{want / GIB:.1f} GiB free at start and {mem.available / GIB:.1f} GiB "
                "is available: stop other jobs or lower GPU_MEM (sparkserve plan)",
            )
        )
    else:
        rows.append(
            Check(
                "memory free",
                "ok",
                f"{mem.available / GIB:.1f} GiB available covers GPU_MEM "
                f"{values['GPU_MEM']} ({want / GIB:.1f} GiB)",
            )
        )
    if mem.swap_total == 0:
        rows.append(Check("swap", "info", "none: the memory guard watches MemAvailable only"))
    else:
        used = mem.swap_used / GIB
        rows.append(
            Check(
                "swap",
                "warn" if used > 1 else "ok",
                f"{mem.swap_total / GIB:.1f} GiB, {used:.1f} GiB in use"
                + ("; something is already swapping" if used > 1 else ""),
            )
        )
    return rows


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(home: Path, docker_root: str | None, need_gb: float, cached: bool) -> list[Check]:
    rows = []
    need = need_gb if not cached else min(need_gb, 25.0)  # the image alone when cached
    places = {"HF cache": home}
    if docker_root:
        places["Docker data"] = Path(docker_root)
    for label, path in places.items():
        where = _existing(path)
        try:
            free = shutil.disk_usage(where).free / GIB
        except OSError as error:
            rows.append(Check(f"disk ({label})", "warn", f"{where}: {error.strerror}"))
            continue
        status: Status = "ok" if free >= need else "blocker"
        rows.append(
            Check(
                f"disk ({label})",
                status,
                f"{free:.0f} GiB free at {where}; a first run needs about {need:.0f}",
            )
        )
    return rows


def check_cache(model: str, home: Path) -> Check:
    local = Path(model).expanduser()
    if local.is_dir():
        return Check(f"cached {model}", "ok", "a local directory")
    repo = None
    try:  # huggingface_hub knows incomplete downloads; fall back to the directory layout
        from huggingface_hub import scan_cache_dir

        for entry in scan_cache_dir(home / "hub").repos:
            if entry.repo_id == model and entry.repo_type == "model":
                repo = f"{entry.size_on_disk / GIB:.1f} GiB ({entry.nb_files} files)"
    except Exception:  # not installed, or no cache yet
        snapshot = find_snapshot(model, home)
        if snapshot is not None:
            size = sum(p.stat().st_size for p in snapshot.glob("*") if p.is_file())
            repo = f"{size / GIB:.1f} GiB in {snapshot}"
    if repo is None:
        return Check(
            f"cached {model}",
            "info",
            f"not in {home / 'hub' / cache_dir_name(model)}: the first start downloads it",
        )
    return Check(f"cached {model}", "ok", repo)


def check_port(settings: Settings) -> Check:
    port = settings.values.PORT
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        busy = sock.connect_ex(("127.0.0.1", port)) == 0
    if busy:
        return Check("port", "warn", f"something already listens on 127.0.0.1:{port} (PORT)")
    return Check("port", "ok", f"127.0.0.1:{port} is free")


def check_pair(
    settings: Settings, env: Mapping[str, str], spark: bool, wait_s: float
) -> list[Check]:
    """With CLUSTER_NODES=2: this node's end of the link, then the meeting with the peer's
    doctor (cluster.preflight) over the ports the engine uses."""
    rows, end = link_rows(settings.text, spark)
    port, watch = settings.values.CLUSTER_PORT, settings.values.CLUSTER_WATCH_PORT
    rows.append(
        Check(
            "engine ports",
            "info",
            f"TCP {port} (CLUSTER_PORT, torch.distributed) and {watch} (CLUSTER_WATCH_PORT) "
            "to the head, and ephemeral TCP ports both ways (vLLM's cross-node message "
            "queues, gloo, NCCL): the link's interface must pass them all",
        )
    )
    if end is None:
        return [*rows, Check("peer", "skip", "not tried: fix the link rows first")]
    side = Side(
        rank=settings.values.CLUSTER_RANK,
        head=settings.values.CLUSTER_HEAD_ADDR,
        port=port,
        watch_port=watch,
        local=str(end.address.ip),
        identity=node_identity(env),
        link={"mtu": end.mtu, "speed_mbps": end.speed_mbps},
        wait_s=wait_s,
        secret=settings.values.CLUSTER_SECRET.encode(),
    )
    return rows + pair_rows(side)


def diagnose(
    env: Mapping[str, str], method: str, need_gb: float, pair_wait_s: float = DEFAULT_PAIR_WAIT_S
) -> list[Check]:
    rows: list[Check] = []
    gpu, spark = check_gpu()
    rows.append(
        Check(
            "machine",
            "ok" if spark else "info",
            "a DGX Spark (GB10)"
            if spark
            else "not a DGX Spark: GPU and Docker rows are informational; memory, disk, "
            "cache, knobs and port are still checked",
        )
    )
    rows.append(gpu)
    docker_rows, docker_root = check_docker(spark)
    rows += docker_rows
    try:
        # as the launcher resolves them (sparkserve.launch.settings)
        settings = resolve_settings(env, method)  # type: ignore[arg-type]
        check_recipe_fits(settings, read_meminfo().total)
    except KnobError as error:
        rows.append(Check("knobs", "blocker", str(error)))
        settings = resolve_settings({}, method)  # type: ignore[arg-type]
    else:
        rows.append(Check("knobs", "ok", "every knob in the environment is allowed"))
    if settings.pair:
        rows += check_pair(settings, env, spark, pair_wait_s)
    rows += check_memory(settings, spark)
    home = hf_home(dict(env))
    models = [ref for _, ref in settings.models()]
    cache_rows = [check_cache(model, home) for model in models]
    cached = all(row.status == "ok" for row in cache_rows)
    rows += check_disk(home, docker_root, need_gb, cached)
    rows += cache_rows
    if home == hf_home({}) or "HF_HOME" not in env:
        rows.append(
            Check(
                "HF cache",
                "info",
                f"{home}; compose keeps its own copy in the "
                "hf-cache volume, which this host path does not show",
            )
        )
    record = marker_path(home)
    if record.is_file():
        rows.append(
            Check(
                "memory guard",
                "blocker",
                f"{record} exists: the guard stopped vLLM; "
                "read it, fix the cause, start once with GUARD_RESUME=1",
            )
        )
    rows.append(check_port(settings))
    return rows


def render(rows: Sequence[Check], all_clear: str = "no blockers: ready for a first run") -> str:
    width = max(len(row.name) for row in rows)
    lines = [f"{'check':<{width}}  {'status':<7}  detail"]
    lines += [f"{row.name:<{width}}  {row.status:<7}  {row.detail}" for row in rows]
    blockers = [row.name for row in rows if row.status == "blocker"]
    lines.append(f"blockers: {', '.join(blockers)}" if blockers else all_clear)
    return "\n".join(lines)


def fleet(args: argparse.Namespace, env: Mapping[str, str]) -> list[Check]:
    """--fleet's rows: the replicas given (else ROUTER_WORKERS) with the API_KEY knob."""
    urls = fleet_workers(args.fleet, env)
    key = resolve_settings(env, args.method).values.API_KEY  # type: ignore[arg-type]
    return fleet_rows(urls, key, args.fleet_timeout)


def run(args: argparse.Namespace) -> int:
    try:
        env = with_dotenv(os.environ, args.env_file)
        if args.fleet is not None:
            rows, all_clear = fleet(args, env), ALL_CLEAR
        else:
            rows = diagnose(env, args.method, args.disk_need_gb, args.pair_wait)
            all_clear = "no blockers: ready for a first run"
    except (KnobError, DotenvError) as error:
        return fail("sparkserve doctor", error, EXIT_BAD_INPUT)
    if args.json:
        print(json.dumps([asdict(row) for row in rows], indent=1))
    else:
        print(render(rows, all_clear))
    return EXIT_FAILED if any(row.status == "blocker" for row in rows) else EXIT_OK


def add_command(commands: Any) -> None:
    parser = commands.add_parser(
        "doctor", help="check this machine for what would stop a first run", description=__doc__
    )
    parser.add_argument(
        "--method",
        choices=tuple(LAUNCHER_SCRIPTS),
        default="dflash",
        help=LAUNCHERS_HELP,
    )
    parser.add_argument(
        "--disk-need-gb",
        type=ranged(float, "--disk-need-gb", 0, 100000),
        default=DEFAULT_DISK_NEED_GB,
        help="free disk a first run needs (image and weights)",
    )
    parser.add_argument(
        "--pair-wait",
        type=ranged(float, "--pair-wait", 1, 3600),
        default=DEFAULT_PAIR_WAIT_S,
        metavar="S",
        help="with CLUSTER_NODES=2: seconds to wait for the other node's doctor "
        f"(default {DEFAULT_PAIR_WAIT_S:g}); run both at about the same time",
    )
    parser.add_argument(
        "--fleet",
        nargs="*",
        metavar="URL",
        help="check the replicas behind the router instead of this machine: these base URLs "
        "(http://HOST:PORT), else ROUTER_WORKERS; each must answer and serve what the others do",
    )
    parser.add_argument(
        "--fleet-timeout",
        type=ranged(float, "--fleet-timeout", 0.1, 600),
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"with --fleet: seconds each request to a replica may take "
        f"(default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--env-file",
        type=Path,
        help="a compose .env to read knobs from (API_KEY, ROUTER_WORKERS, ...); the "
        "environment wins",
    )
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    one_line_errors(parser, "sparkserve doctor")
    parser.set_defaults(run=run)


if __name__ == "__main__":
    defaults = {"disk_need_gb": DEFAULT_DISK_NEED_GB, "pair_wait": DEFAULT_PAIR_WAIT_S,
                "fleet": None, "fleet_timeout": DEFAULT_TIMEOUT_S, "env_file": None}  # fmt: skip
    sys.exit(run(argparse.Namespace(method="dflash", json=0, **defaults)))
