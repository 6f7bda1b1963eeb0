"""Deterministic prompts of three kinds, and a long shared prefix of a chosen length.

No data set is downloaded: the texts are built here, seeded, so two runs send the same bytes.
"""

from __future__ import annotations

import json
import random

from sparkserve.command_line import UsageError

KINDS = ("prose", "code", "agent")

_SUBJECTS = (
    "the harbour", "the old library", "a mountain railway", "the night market", "a glacier",
    "the city archive", "a lighthouse keeper", "the river delta", "a small bakery",
    "the observatory",
)  # fmt: skip
_VERBS = (
    "remembers", "reshapes", "outlasts", "watches over", "borrows from", "gives way to",
    "listens to", "measures", "hides", "returns to",
)  # fmt: skip
_TAILS = (
    "every winter when the roads close", "long after the visitors have gone home",
    "in ways the maps never recorded", "as the tide turns twice a day",
    "without anyone noticing at first", "while the town sleeps", "one season at a time",
)  # fmt: skip


def prose_paragraph(rng: random.Random, sentences: int = 6) -> str:
    out = []
    for _ in range(sentences):
        a, b = rng.sample(_SUBJECTS, 2)
        out.append(f"{a.capitalize()} {rng.choice(_VERBS)} {b} {rng.choice(_TAILS)}.")
    return " ".join(out)


def prose_prompt(variant: int) -> str:
    rng = random.Random(1000 + variant)
    context = "\n\n".join(prose_paragraph(rng) for _ in range(3))
    return (
        f"{context}\n\nVariant {variant}. Continue this story in plain, flowing prose: describe "
        "the place, the people who live there and how the seasons change it. Write at length."
    )


def code_prompt(variant: int) -> str:
    return (
        f"# Variant {variant}\n"
        "Complete this Python module. Implement every method with type hints and docstrings, "
        "then add unit tests with pytest.\n\n"
        "```python\n"
        "from __future__ import annotations\n\n"
        "import heapq\n"
        "from dataclasses import dataclass, field\n\n\n"
        "@dataclass(order=True)\n"
        "class Job:\n"
        "    priority: int\n"
        "    name: str = field(compare=False)\n"
        "    payload: dict[str, object] = field(default_factory=dict, compare=False)\n\n\n"
        "class Scheduler:\n"
        '    """A priority queue of jobs with retries, deadlines and cancellation."""\n\n'
        "    def __init__(self, max_retries: int = 3) -> None:\n"
        "        self._heap: list[Job] = []\n"
        "        self._cancelled: set[str] = set()\n"
        "        self.max_retries = max_retries\n\n"
        "    def submit(self, job: Job) -> None:\n"
    )


TOOLS = [
    {
        "name": "search_files",
        "description": "Search the repository for a regular expression.",
        "parameters": {
            "type": "object",
            "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
            "required": ["pattern"],
        },
    },
    {
        "name": "read_file",
        "description": "Read a file, optionally a line range.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "start": {"type": "integer"},
                "end": {"type": "integer"},
            },
            "required": ["path"],
        },
    },
    {
        "name": "run_tests",
        "description": "Run the test suite, or the tests matching a keyword.",
        "parameters": {"type": "object", "properties": {"keyword": {"type": "string"}}},
    },
]


def agent_prompt(variant: int) -> str:
    history = [
        {"role": "user", "content": f"Task {variant}: the scheduler drops retried jobs."},
        {
            "role": "assistant",
            "tool_calls": [{"name": "search_files", "arguments": {"pattern": "def retry"}}],
        },
        {"role": "tool", "name": "search_files", "content": "src/sched.py:88: def retry(job):"},
        {
            "role": "assistant",
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "src/sched.py", "start": 80}}
            ],
        },
        {"role": "tool", "name": "read_file", "content": "def retry(job):\n    job.tries += 1"},
    ]
    return (
        "You are a coding agent. Answer only with tool calls, one JSON object per line, each "
        '{"name": ..., "arguments": {...}}, using these tools:\n'
        f"{json.dumps(TOOLS, indent=1)}\n\nThe conversation so far, as JSON:\n"
        f"{json.dumps(history, indent=1)}\n\nNext tool calls:\n"
    )


def prompt(kind: str, variant: int) -> str:
    makers = {"prose": prose_prompt, "code": code_prompt, "agent": agent_prompt}
    if kind not in makers:
        raise ValueError(f"prompt kind {kind!r}: must be one of {', '.join(makers)}")
    return makers[kind](variant)


def long_prefix(chars: int, nonce: str) -> str:
    """`chars` characters of document text, opened by `nonce` so no cache holds it: never
    fewer than that opening line, whose nonce must stay whole."""
    if chars < 0:
        raise ValueError(f"long_prefix: chars={chars}: must be 0 or more")
    rng = random.Random(7)
    opening = f"Document {nonce}.\n"
    parts: list[str] = []
    size = len(opening)
    while size < chars:
        paragraph = prose_paragraph(rng) + "\n\n"
        parts.append(paragraph)
        size += len(paragraph)
    return opening + "".join(parts)[: max(chars - len(opening), 0)]


def parse_kinds(text: str) -> tuple[str, ...]:
    """--kinds: some of KINDS, comma-separated, each once; UsageError (one line) otherwise."""
    kinds = tuple(k.strip() for k in text.split(","))
    if not text.strip() or any(k not in KINDS for k in kinds) or len(set(kinds)) != len(kinds):
        raise UsageError(f"bad --kinds {text!r}: must be some of {','.join(KINDS)}, each once")
    return kinds
