"""Every image this repository pulls is pinned by its digest (`name:tag@sha256:<64 hex>`), or
listed in UNPINNED with the reason it is not: the Dockerfile's base images (its `*_IMAGE` build
arguments and any FROM that names an image) and docker-compose.yml's `image:` of every service
not built here (those with `build:` are made from this repository, never pulled).

`python3 scripts/lib/image_pins.py [REPO]` prints one line per reference that is neither and
exits 1; scripts/lint.sh runs it. A digest is never guessed: where none is known, the
reference goes into UNPINNED with the reason, and the lint says so at every run.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

PINNED = re.compile(r"[a-z0-9./_-]+(:[A-Za-z0-9._-]+)?@sha256:[0-9a-f]{64}")

# Where each digest in the repository came from, and what is left unpinned and why.
# nvidia/cuda:13.0.1-devel-ubuntu24.04  sha256:7d2f6a8c...: the tag's digest as public projects
#   pin it (several, one built with --platform linux/arm64), not read from the registry here;
#   NVIDIA has re-pushed this tag (other, older digests are pinned elsewhere).
# prom/prometheus:v3.5.0 sha256:63805ebb..., prom/node-exporter:v1.9.1 sha256:d00a542e...,
# grafana/grafana:11.6.0 sha256:62d2b9d2...: the same digest in every public pin found.
UNPINNED = {
    "debian:bookworm-slim": (
        "the cpu image's base: a tag Debian moves with every point release, and no digest for "
        "it could be read here (no registry); the builds here pass their own CPU_BASE_IMAGE"
    ),
}


def dockerfile_refs(text: str) -> list[str]:
    """The images the Dockerfile builds from: its *_IMAGE build arguments' defaults and every
    FROM naming an image (not a build argument, not an earlier stage)."""
    refs = re.findall(r"^ARG \w+_IMAGE=(\S+)$", text, re.M)
    stages: set[str] = set()
    for source, stage in re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, re.M | re.I):
        if not source.startswith("$") and source not in stages:
            refs.append(source)
        stages.add(stage)
    return refs


def compose_refs(text: str) -> list[str]:
    """The images compose pulls: every service's image but those it builds here."""
    services = yaml.safe_load(text)["services"]
    return [s["image"] for s in services.values() if "image" in s and "build" not in s]


def problems(repo: Path) -> list[str]:
    refs = [("Dockerfile", r) for r in dockerfile_refs((repo / "Dockerfile").read_text())]
    refs += [
        ("docker-compose.yml", r) for r in compose_refs((repo / "docker-compose.yml").read_text())
    ]
    found = []
    for where, ref in refs:
        if not PINNED.fullmatch(ref) and ref not in UNPINNED:
            found.append(
                f"{where}: {ref} is pinned by tag only: add @sha256:<its digest> (read from "
                "the registry), or list it in scripts/lib/image_pins.py UNPINNED with the reason"
            )
    listed = {ref for _, ref in refs}
    found += [f"image_pins.py: UNPINNED lists {ref}, which nothing uses" for ref in
              sorted(set(UNPINNED) - listed)]  # fmt: skip
    return found


def main(argv: list[str]) -> int:
    repo = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2]
    found = problems(repo)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
