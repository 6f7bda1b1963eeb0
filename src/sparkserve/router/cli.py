"""`sparkserve router`: N replicas behind vLLM's router, and its drain.

  sparkserve router                 check the knobs, run vllm-router on loopback and the key gate
                                    in front (published where the server is); SIGTERM stops both
  sparkserve router drain URL       take a replica out of rotation (then stop it: no client error)
  sparkserve router add URL         put it back once its /health answers
  sparkserve router workers         the replicas in rotation, each with health and load

drain, add and workers talk to the router's admin routes on loopback, where the router runs
(in compose: `docker compose exec router python3 -m sparkserve router drain URL`): the gate
never lets them through.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sparkserve.command_line import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    fail,
    one_line_errors,
    sigterm_when_parent_dies,
)
from sparkserve.knobs.registry import KnobError
from sparkserve.launch.dotenv import DotenvError, with_dotenv
from sparkserve.router import admin as admin_routes
from sparkserve.router.command import ROUTER_PORT, gate_argv, router_argv, upstream
from sparkserve.router.settings import router_settings
from sparkserve.router.workers import normalise_worker

PROG = "sparkserve router"
POLL_S = 0.2
ROUTER_STOP_S = 10  # vllm-router exits at once on SIGTERM; then SIGKILL


def add_command(commands: Any) -> None:
    parser = commands.add_parser("router", help="N replicas behind vLLM's router, with the key")
    one_line_errors(parser, PROG)
    parser.add_argument("--env-file", type=Path, default=None, help="a .env to read knobs from")
    parser.add_argument(
        "--router-port", type=int, default=ROUTER_PORT,
        help="vllm-router's own port, on loopback (never published)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-host", default="127.0.0.1",
        help="where the router's metrics listen (0.0.0.0 in its container, which compose "
        "publishes on the host's loopback only)",
    )  # fmt: skip
    parser.add_argument(
        "--grace-s", type=int, default=50,
        help="on SIGTERM, how long requests in flight may finish before the gate closes them",
    )  # fmt: skip
    parser.set_defaults(run=run, router_command=None)
    actions = parser.add_subparsers(dest="router_command", metavar="ACTION")
    for name, help_text in (
        ("drain", "take a replica out of rotation (its requests in flight finish)"),
        ("add", "put a replica (back) into rotation once its /health answers"),
    ):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("url", help="the replica's base URL, as in ROUTER_WORKERS")
    actions.add_parser("workers", help="the replicas in rotation, with health and load (JSON)")


def run(args: argparse.Namespace) -> int:
    if args.router_command is None:
        return serve(args)
    admin = upstream(args.router_port)
    try:
        if args.router_command == "workers":
            print(json.dumps(admin_routes.workers(admin), indent=2))
            return EXIT_OK
        url = normalise_worker(args.url)
        if args.router_command == "drain":
            return drain(admin, url)
        return add(admin, url)
    except ValueError as error:
        return fail(PROG, error)
    except OSError as error:
        return fail(PROG, f"the router at {admin} did not answer ({error}): is it running here?")


def drain(admin: str, url: str) -> int:
    """Remove `url` from rotation. The router answers 200 even for a URL it does not hold, so
    the list is read before and after: the URL must be there first and gone after."""
    listed = admin_routes.in_rotation(admin)
    if url not in listed:
        return fail(PROG, f"{url} is not in rotation (in rotation: {', '.join(listed) or 'none'})")
    status, text = admin_routes.remove(admin, url)
    if status != 200 or url in admin_routes.in_rotation(admin):
        return fail(PROG, f"the router did not remove {url}: HTTP {status} {text.strip()}", 1)
    print(f"{url} is out of rotation: no new request goes to it; stop it now (its own drain "
          f"finishes what it still serves), `{PROG} add {url}` to bring it back")  # fmt: skip
    return EXIT_OK


def add(admin: str, url: str) -> int:
    """Put `url` into rotation; the router waits for its /health (up to 600 s) first."""
    if url in admin_routes.in_rotation(admin):
        return fail(PROG, f"{url} is already in rotation")
    status, text = admin_routes.add(admin, url)
    if status != 200 or url not in admin_routes.in_rotation(admin):
        return fail(PROG, f"the router did not add {url}: HTTP {status} {text.strip()}", 1)
    print(f"{url} is in rotation")
    return EXIT_OK


def serve(args: argparse.Namespace) -> int:
    """Check every knob first (one line, exit 2, nothing started), then run both processes
    until SIGTERM or SIGINT (exit 0 once both stopped) or until one ends on its own (the
    other is stopped, exit 1)."""
    try:
        env = with_dotenv(os.environ, args.env_file)
        settings = router_settings(env)
    except (KnobError, DotenvError, OSError) as error:
        return fail(PROG, error)
    if settings.port == args.router_port:
        return fail(PROG, f"ROUTER_PORT={settings.port} is the router's own loopback port: "
                          "pick another (or --router-port)", EXIT_BAD_INPUT)  # fmt: skip
    if importlib.util.find_spec("vllm_router") is None:
        return fail(PROG, f"vllm-router is not installed for {sys.executable} (the images carry "
                          "it: requirements/*.lock pin vllm-router==0.1.17)")  # fmt: skip
    stopping: list[int] = []

    def request_stop(signum: int, _frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    parent = os.getpid()
    child_env = {k: v for k, v in env.items() if k != "API_KEY"}
    gate_env = {**child_env, "API_KEY": settings.api_key}
    router = _start(router_argv(settings, args.router_port, args.metrics_host), child_env, parent)
    gate = _start(gate_argv(settings, args.router_port, args.grace_s), gate_env, parent)
    print(f"{PROG}: {len(settings.workers)} replicas ({', '.join(settings.workers)}), policy "
          f"{settings.policy}; the API on {settings.host}:{settings.port}, vllm-router on "
          f"{upstream(args.router_port)}, its metrics on {args.metrics_host}:"
          f"{settings.metrics_port}", file=sys.stderr, flush=True)  # fmt: skip
    children = {"the key gate": gate, "vllm-router": router}
    while not stopping:
        for name, child in children.items():
            status = child.poll()
            if status is not None:
                print(f"{PROG}: {name} exited with status {status}; stopping the other",
                      file=sys.stderr, flush=True)  # fmt: skip
                _stop(gate, args.grace_s + 5)
                _stop(router, ROUTER_STOP_S)
                return EXIT_FAILED
        time.sleep(POLL_S)
    # The gate first: the streams in flight finish through it, then the router goes.
    _stop(gate, args.grace_s + 5)
    _stop(router, ROUTER_STOP_S)
    return EXIT_OK


def _start(argv: list[str], env: dict[str, str], parent: int) -> subprocess.Popen[bytes]:
    """A child that gets SIGTERM when this process dies, even by SIGKILL; stdin closed, its
    output shared with this process (the container's log)."""

    def orphan_stops() -> None:
        sigterm_when_parent_dies(parent)

    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, preexec_fn=orphan_stops)


def _stop(child: subprocess.Popen[bytes], wait_s: float) -> None:
    if child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(wait_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
