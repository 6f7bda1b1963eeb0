"""The options and set-up every command that restarts a running server shares (`tune`,
`verify`): which driver restarts it (compose or its launcher), where it answers, where the
output goes, the settings it was started with as sparkserve resolves them, and the run that
maps what broke it off to the exit status."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

from sparkserve import command_line as cl
from sparkserve import recipes
from sparkserve.client.server import Server, ServerInfo
from sparkserve.client.tool import BEFORE_LOAD_ERRORS, RunAborted, output_folder, say
from sparkserve.knobs.registry import Launcher
from sparkserve.launch.dotenv import with_dotenv
from sparkserve.launch.settings import Settings, resolve_settings
from sparkserve.recipes import RecipeError
from sparkserve.server.driver import ComposeDriver, Driver, LauncherDriver, RestartFailed
from sparkserve.server.restarts import Interrupted, interruptible

Body = Callable[[argparse.Namespace, Mapping[str, str]], int]
Run = Callable[[argparse.Namespace, Mapping[str, str] | None], int]

REPO = Path(__file__).resolve().parents[3]
# docker-compose.yml's server services and the launcher each runs
SERVICES: dict[str, Launcher] = {"sparkserve": "dflash", "sparkserve-mtp": "mtp",
                                 "sparkserve-cpu": "dflash"}  # fmt: skip


def add_restart_options(parser: argparse.ArgumentParser, prog: str) -> None:
    cl.one_line_errors(parser, prog)
    parser.add_argument(
        "--driver",
        choices=("compose", "launcher"),
        default="compose",
        help="how the server is restarted (default compose)",
    )
    parser.add_argument(
        "--service", default="sparkserve", help="compose: the server's service (default sparkserve)"
    )
    parser.add_argument(
        "--project-dir",
        type=Path,
        default=REPO,
        help="compose: the folder of docker-compose.yml (default this checkout)",
    )
    parser.add_argument(
        "--launcher",
        choices=tuple(recipes.LAUNCHER_SCRIPTS),
        default="dflash",
        help=f"launcher: {recipes.LAUNCHERS_HELP}",
    )
    parser.add_argument(
        "--pid-file", type=Path, help="launcher: a file holding the running server's pid; updated"
    )
    parser.add_argument(
        "--server-log",
        type=Path,
        help="launcher: where restarted servers log (default OUT/server.log)",
    )
    parser.add_argument("--url", help="the server (default http://127.0.0.1:$PORT)")
    parser.add_argument("--model", help="served model name (default: the only one served)")
    parser.add_argument("--out", type=Path, help="output folder (default: a new dated one)")
    parser.add_argument(
        "--env-file", type=Path, help="the compose .env the knobs come from; the environment wins"
    )
    parser.add_argument(
        "--healthy-timeout-s",
        type=cl.ranged(float, "--healthy-timeout-s", 10),
        default=900.0,
        help="seconds a restart may take to be healthy (900)",
    )


def make_driver(args: argparse.Namespace, env: Mapping[str, str], url: str, out: Path) -> Driver:
    """The driver the options name, checked: UsageError (or NotSparkserve) before any restart."""
    if args.driver == "launcher":
        if args.pid_file is None:
            raise cl.UsageError("--driver launcher needs --pid-file (the server's pid)")
        driver: Driver = LauncherDriver(
            args.launcher,
            args.pid_file,
            url,
            args.server_log or out / "server.log",
            recipes.launcher_dir(),
        )
    else:
        driver = ComposeDriver(args.service, url, args.project_dir, args.env_file)
    driver.check()  # type: ignore[attr-defined]
    return driver


def launcher_of(args: argparse.Namespace) -> Launcher:
    if args.driver == "compose":
        return SERVICES.get(args.service, "dflash")
    return args.launcher  # type: ignore[no-any-return]


def server_settings(knobs: Mapping[str, str], launcher: Launcher) -> Settings:
    """The settings of the running server, from the knobs its driver reports."""
    env = dict(knobs)
    if "VLLM_API_KEY" in env:  # the launcher hands the key to vLLM under this name
        env.setdefault("API_KEY", env["VLLM_API_KEY"])
    return resolve_settings(env, launcher)


class Prepared(NamedTuple):
    server: Server
    info: ServerInfo
    out: Path
    driver: Driver
    served: Settings  # what the running server was started with


def prepare(args: argparse.Namespace, env: Mapping[str, str], stem: str, tool: str) -> Prepared:
    """Before any restart: the server reached with the knobs of `env` (its URL and key), the
    output folder, the checked driver, and the server's own settings; a pair is refused."""
    settings = resolve_settings(env, launcher_of(args))
    url = args.url or f"http://127.0.0.1:{settings.values.PORT}"
    server = Server(url, settings.values.API_KEY)
    info = server.probe(args.model or None)
    out = output_folder(args.out, stem)
    driver = make_driver(args, env, url, out)
    served = server_settings(driver.knobs(), launcher_of(args))
    if served.pair:
        raise cl.UsageError(f"CLUSTER_NODES=2: {tool} restarts one server; {tool} a pair by hand")
    return Prepared(server, info, out, driver, served)


def guarded(prog: str, tag: str, body: Body) -> Run:
    """`body` run on the environment over --env-file, with SIGINT and SIGTERM raising
    Interrupted inside it; bad input exits 2, an interruption 130 (the body put the starting
    setting back), a restart or run that broke off 3, each in one line."""

    def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
        try:
            merged = with_dotenv(os.environ if env is None else env, args.env_file)
            with interruptible():
                return body(args, merged)
        except (*BEFORE_LOAD_ERRORS, RecipeError) as exc:
            return cl.fail(prog, exc, cl.EXIT_BAD_INPUT)
        except Interrupted as exc:
            say(f"[{tag}] interrupted ({exc}): the starting setting is back")
            return cl.EXIT_INTERRUPTED
        except (RestartFailed, RunAborted) as exc:
            return cl.fail(prog, exc, cl.EXIT_STOPPED)

    return run
