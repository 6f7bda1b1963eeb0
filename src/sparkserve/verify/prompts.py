"""The prompt set verify sends, fixed and versioned: a result names the version it ran, so two
runs (two machines, two releases) compare only on the same prompts. Change a prompt and the
version goes up.

Every prompt is rendered to token ids by the server's own /tokenize (chat ones through the
model's chat template, thinking off) and sent as ids, so that every setting sees exactly the
same tokens and a teacher-forced run can append the reference's tokens after them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VERSION = "v1"
NO_THINKING = {"enable_thinking": False}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


@dataclass(frozen=True)
class Prompt:
    name: str
    kind: str  # chat, code, tool use, shared prefix, prose
    messages: tuple[dict[str, str], ...] = ()  # a chat prompt; else `text`
    text: str = ""
    tools: tuple[dict[str, Any], ...] = ()
    shared_prefix: bool = False  # its system message is the long document (`document`)

    def tokenize_body(self, model: str, document: str) -> dict[str, Any]:
        """The /tokenize request that renders this prompt."""
        if not self.messages:
            return {"model": model, "prompt": self.text}
        messages = [dict(m) for m in self.messages]
        if self.shared_prefix:
            messages.insert(0, {"role": "system", "content": document})
        body: dict[str, Any] = {"model": model, "messages": messages,
                                "add_generation_prompt": True,
                                "chat_template_kwargs": NO_THINKING}  # fmt: skip
        if self.tools:
            body["tools"] = [dict(t) for t in self.tools]
        return body


PROMPTS: tuple[Prompt, ...] = (
    Prompt(
        "multi-turn",
        "chat",
        messages=(
            {"role": "system", "content": "You are a concise assistant for a home lab."},
            {"role": "user", "content": "My server has 128 GB of unified memory. What is that?"},
            {
                "role": "assistant",
                "content": "The CPU and the GPU share one pool of memory, so "
                "whatever the GPU takes, the operating system loses.",
            },
            {"role": "user", "content": "So how much should the model server leave to the OS?"},
        ),
    ),
    Prompt(
        "code-chat",
        "code",
        messages=(
            {
                "role": "user",
                "content": "Write a Python function merge_intervals(intervals) that "
                "merges overlapping [start, end] pairs. Code only.",
            },
        ),
    ),
    Prompt(
        "code-completion",
        "code",
        text=(
            "import heapq\n\n\ndef k_smallest(items: list[int], k: int) -> list[int]:\n"
            '    """The k smallest items, in order."""\n'
        ),
    ),
    Prompt(
        "tool-use",
        "tool use",
        tools=(WEATHER_TOOL,),
        messages=(
            {
                "role": "user",
                "content": "Is it colder in Oslo or in Bergen right now? Use the tool.",
            },
        ),
    ),
    Prompt(
        "prefix-a",
        "shared prefix",
        shared_prefix=True,
        messages=(
            {"role": "user", "content": "Which setting keeps memory for the operating system?"},
        ),
    ),
    Prompt(
        "prefix-b",
        "shared prefix",
        shared_prefix=True,
        messages=(
            {"role": "user", "content": "Summarise the section on draining in one sentence."},
        ),
    ),
    Prompt("prose", "prose", text="The first snow came early that year, and the valley "),
)

_TOPICS = ("memory", "draining", "prefix caching", "speculation", "the lm head", "restarts",
           "health checks", "the key", "metrics", "downloads")  # fmt: skip


def document(paragraphs: int) -> str:
    """The long shared system message: `paragraphs` numbered sections of a made-up operations
    manual (deterministic, so every run and every setting sends the same text)."""
    lines = ["Operations manual of the model server. Answer from it."]
    for number in range(1, paragraphs + 1):
        topic = _TOPICS[number % len(_TOPICS)]
        lines.append(
            f"Section {number}, on {topic}: setting {number * 7 % 97} changes how {topic} "
            f"behaves under load; keep it below {number * 13 % 89 + 10} unless the log says "
            f"otherwise, and restart the server after changing it (rule {number}-{topic[:3]})."
        )
    return "\n".join(lines)
