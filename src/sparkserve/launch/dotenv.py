"""Read KEY=value files the way Docker Compose reads `.env` (versions.env is one too).

`scripts/stress_mem.sh` and `scripts/bench.sh`, when they run a tool with the host's Python
(`--url`, or no server under compose; otherwise they run it in the server's container), read
the same `.env` as compose: the server's PORT, API_KEY, OS_RESERVE_GB and the rest without the
user repeating them. As with compose, a variable already set in the environment
wins over the file. Understood: `KEY=value`, `export KEY=value`, single or double quotes,
blank lines, `#` comments (after unquoted values too, when preceded by a space).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

_LINE = re.compile(r"^(?:export\s+)?(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<value>.*)$")


class DotenvError(ValueError):
    """A line of the file is not KEY=value; the message names the file and line."""


def _value(raw: str) -> str:
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        inner = raw[1:-1]
        return inner.replace('\\"', '"').replace("\\n", "\n") if raw[0] == '"' else inner
    return re.split(r"\s+#", raw, maxsplit=1)[0].strip()


def parse(text: str, name: str = ".env") -> dict[str, str]:
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _LINE.match(stripped)
        if match is None:
            raise DotenvError(f"{name}:{number}: not KEY=value: {stripped[:60]!r}")
        values[match["key"]] = _value(match["value"])
    return values


def with_dotenv(env: Mapping[str, str], path: Path | None) -> dict[str, str]:
    """`env` plus the file's variables that `env` does not set (no file: `env` as it is)."""
    merged = dict(env)
    if path is None or not path.is_file():
        return merged
    for key, value in parse(path.read_text(), str(path)).items():
        merged.setdefault(key, value)
    return merged
