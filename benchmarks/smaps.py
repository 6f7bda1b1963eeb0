"""Where a process's resident memory lies, by mapping (/proc/PID/smaps): what the soak uses to
say which memory of vLLM's model worker grows (the KV pool's first touch, malloc's arenas, a
library's data).

A mapping is keyed by its start address and path (a heap grows at its end); its kind is `file`
(a path), `heap` (`[heap]`, malloc's main arena), `stack`, or `anon` (other anonymous memory:
large tensors such as the KV pool, threads' malloc arenas, Python's arenas), with its size in
`size_mib` so a mapping the size of the pool is recognisable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KIB_PER_MIB = 1024


@dataclass(frozen=True)
class Mapping:
    key: str  # "start path"
    kind: str  # file, heap, stack, anon
    size_mib: float
    rss_mib: float


def short(path: str) -> str:
    """A file's name without the machine's folders: from site-packages on, else the base name."""
    if not path.startswith("/"):
        return path
    _, found, rest = path.partition("site-packages/")
    return rest if found else path.rsplit("/", 1)[-1]


def kind_of(path: str) -> str:
    if path == "[heap]":
        return "heap"
    if path.startswith("[stack"):
        return "stack"
    if path.startswith("/") and not path.startswith("/memfd:"):
        return "file"
    return "anon"


def snapshot(pid: int) -> dict[str, Mapping]:
    """Every mapping of `pid` with its Rss (empty when the process is gone or unreadable)."""
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    except OSError:
        return {}
    found: dict[str, Mapping] = {}
    key, kind, size = "", "", 0.0
    for line in lines:
        head = line.split(maxsplit=5)
        if "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line
            path = head[5] if len(head) > 5 else ""
            key, kind = f"{head[0].split('-')[0]} {short(path)}".strip(), kind_of(path)
        elif head[0] == "Size:":
            size = int(head[1]) / KIB_PER_MIB
        elif head[0] == "Rss:":
            found[key] = Mapping(key, kind, round(size, 3), int(head[1]) / KIB_PER_MIB)
    return found


def by_kind(mappings: dict[str, Mapping]) -> dict[str, float]:
    """Rss per kind, MiB."""
    totals: dict[str, float] = {}
    for mapping in mappings.values():
        totals[mapping.kind] = totals.get(mapping.kind, 0.0) + mapping.rss_mib
    return {kind: round(total, 1) for kind, total in sorted(totals.items())}


def grown(first: dict[str, Mapping], last: dict[str, Mapping], top: int = 8) -> list[dict]:
    """The mappings whose Rss grew most from `first` to `last` (new mappings from 0)."""
    rows = []
    for key, mapping in last.items():
        before = first[key].rss_mib if key in first else 0.0
        rows.append({"mapping": key, "kind": mapping.kind, "size_mib": mapping.size_mib,
                     "rss_before_mib": round(before, 1), "rss_after_mib": round(mapping.rss_mib, 1),
                     "growth_mib": round(mapping.rss_mib - before, 1)})  # fmt: skip
    rows.sort(key=lambda row: -row["growth_mib"])
    return rows[:top]
