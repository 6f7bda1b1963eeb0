"""Memory helpers shared by `sparkserve plan`, `guard` and `doctor`: the host's memory
(/proc), a checkpoint's config and size, and the KV cache vLLM will build (kv.py)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


def one_line_errors(parser: argparse.ArgumentParser, prog: str, status: int = 2) -> None:
    """Make argparse report a bad option in one line (no usage block), with `status`."""

    def error(message: str) -> NoReturn:
        print(f"{prog}: {message}", file=sys.stderr)
        sys.exit(status)

    parser.error = error  # type: ignore[method-assign]
