"""What shell reads from Python: quoted words for people, NUL-separated records for the launchers.

The launchers take vLLM's command and their companions' from Python (sparkserve.start.cli) as
`records`, which serve_common.sh's set_variables reads as data into shell variables, never
as code: no `eval`, so no value (a model name, EXTRA_ARGS, a key) can ever run in the shell.
A record is `scalar NAME VALUE` or `array NAME COUNT WORD...`, every field ended by a NUL
(which no value can hold: a process's arguments and environment cannot carry one either).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

Value = str | Sequence[str]  # a scalar, or an array's words
NAME = re.compile(r"[A-Z][A-Z0-9_]*")  # set_variables refuses any other name


def shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def records(variables: Mapping[str, Value]) -> bytes:
    fields: list[str] = []
    for name, value in variables.items():
        if not NAME.fullmatch(name):
            raise ValueError(f"{name!r}: not a launcher variable name (A-Z, 0-9, _)")
        if isinstance(value, str):
            fields += ["scalar", name, value]
        else:
            fields += ["array", name, str(len(value)), *value]
    for field in fields:
        if "\0" in field:
            raise ValueError(f"a NUL inside {field[:40]!r}: no shell variable can hold one")
    return b"".join(field.encode() + b"\0" for field in fields)


def read_records(data: bytes) -> dict[str, Value]:
    """`records` read back, as set_variables reads them (for tests and tools)."""
    fields = data.decode().split("\0")
    if fields.pop() != "":
        raise ValueError("records end with a NUL")
    found: dict[str, Value] = {}
    i = 0
    while i < len(fields):
        kind, name = fields[i], fields[i + 1]
        if kind == "scalar":
            found[name] = fields[i + 2]
            i += 3
        elif kind == "array":
            count = int(fields[i + 2])
            found[name] = fields[i + 3 : i + 3 + count]
            i += 3 + count
        else:
            raise ValueError(f"{kind!r}: not a record kind")
    return found
