"""Print, as JSON, every route vLLM's own app builder registers for a `vllm serve` command line.

Run with the CPU serving venv's python: `vllm_routes.py TASKS_JSON ARG...`, where the ARGs are
what follows `vllm serve` and TASKS_JSON the supported tasks the server logged ("Supported
tasks: ..."). The app is built by vLLM's build_app, as its API server builds it (routers,
endpoint plugins, middleware given with --middleware), without an engine: nothing is served.
One JSON list on the last line: {"path", "methods", "kind"} per route, in the router's order.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> None:
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    tasks = tuple(json.loads(argv[0]))
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[1:])
    app = build_app(args, tasks)
    routes = [
        {
            "path": route.path,
            "methods": sorted(getattr(route, "methods", None) or ()),
            "kind": type(route).__name__,
        }
        for route in app.routes
    ]
    print(json.dumps(routes))


if __name__ == "__main__":
    main(sys.argv[1:])
