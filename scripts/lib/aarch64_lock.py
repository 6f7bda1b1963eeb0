"""The hash-locked image requirements (requirements/spark-aarch64.lock), read as pin blocks.

scripts/check_aarch64_stack.sh uses it to list the pins and to write a copy of the lock without
the pins that have no wheel for the emulated Python (their older releases are added back with
their own hashes). Standard library only: it runs on the host's python3.

  aarch64_lock.py pins LOCK          print `name==version` per pin
  aarch64_lock.py drop LOCK NAME...  print LOCK without those pins' blocks
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)==(\S+)")


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    block: str  # the pin line and its --hash continuation lines, newline-terminated


def normalize(name: str) -> str:
    """PEP 503 name: case and runs of -_. do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> tuple[str, list[Pin]]:
    """Split a lock into its leading comment lines and its pin blocks, in order."""
    head: list[str] = []
    pins: list[Pin] = []
    block: list[str] = []
    for line in text.splitlines(keepends=True):
        match = _PIN.match(line)
        if match:
            if block:
                pins.append(_pin(block))
            block = [line]
        elif block and line[:1].isspace():
            block.append(line)
        elif not pins and not block and (line.startswith("#") or not line.strip()):
            head.append(line)
        elif line.strip():
            raise ValueError(f"unexpected lock line: {line.rstrip()!r}")
    if block:
        pins.append(_pin(block))
    return "".join(head), pins


def _pin(block: list[str]) -> Pin:
    match = _PIN.match(block[0])
    assert match is not None
    return Pin(match.group(1), match.group(2), "".join(block))


def without(text: str, names: list[str]) -> str:
    """The lock with the pins NAMES removed; a name the lock does not pin is an error."""
    head, pins = read_pins(text)
    wanted = {normalize(name) for name in names}
    missing = wanted - {normalize(pin.name) for pin in pins}
    if missing:
        raise ValueError(f"not pinned in the lock: {', '.join(sorted(missing))}")
    kept = [pin.block for pin in pins if normalize(pin.name) not in wanted]
    return head + "".join(kept)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in {"pins", "drop"} or (argv[0] == "drop" and len(argv) < 3):
        print("usage: aarch64_lock.py pins LOCK | drop LOCK NAME...", file=sys.stderr)
        return 2
    command, lock, names = argv[0], Path(argv[1]), argv[2:]
    try:
        text = lock.read_text()
        if command == "pins":
            sys.stdout.write("".join(f"{p.name}=={p.version}\n" for p in read_pins(text)[1]))
        else:
            sys.stdout.write(without(text, names))
    except (OSError, ValueError) as error:
        print(f"aarch64_lock.py: {lock}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
