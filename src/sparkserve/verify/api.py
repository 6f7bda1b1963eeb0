"""The API as clients use it, on the served setting: selftest's checks of the key on every
route, completions, chat, streaming, tool calls and the reasoning split, plus the error bodies
a client reads when it asks for something the server refuses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkserve.client import checks
from sparkserve.client.checks import Probe, Result, not_tested
from sparkserve.knobs.registry import BY_NAME
from sparkserve.launch.settings import Settings


def probe_for(server: Any, model: str, settings: Settings, out: Path) -> Probe:
    return Probe(server=server, key=settings.values.API_KEY, model=model, speculative=False,
                 head_report_dir=out, int8_head=False, cuda=False,
                 metrics_open=settings.values.METRICS_OPEN,
                 tool_format=model_tool_format(settings),
                 tool_parser=settings.values.TOOL_PARSER)  # fmt: skip


def model_tool_format(settings: Settings) -> str:
    """The tool-call format the model writes, as the parser its recipe names, or the image's
    default (its model's) without a recipe: not the TOOL_PARSER a user set over it, which is
    what the tool-call check puts to the test."""
    if settings.recipe is not None:
        chosen = settings.recipe.knobs_for(settings.launcher).get("TOOL_PARSER")
        if chosen is not None:
            return chosen
    return BY_NAME["TOOL_PARSER"].default_for(settings.launcher, settings.image)


def _error_message(body: Any) -> str:
    """The message of an OpenAI-style error body ({"error": {"message": ...}}), or of vLLM's
    older flat one ({"message": ...}); empty where there is none."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    return ""


def check_error_bodies(probe: Probe, max_len: int) -> Result:
    """A request longer than the context gets 400 and an unknown model 404, each with a JSON
    error body whose message a client can show."""
    asks = {
        "too long": (400, {"model": probe.model, "prompt": "hi", "max_tokens": max_len + 1}),
        "unknown model": (404, {"model": probe.model + "-no-such", "prompt": "hi",
                                "max_tokens": 1}),
    }  # fmt: skip
    wrong, seen = [], []
    for what, (expected, body) in asks.items():
        status, reply = checks.reply_of(probe, "POST", "/v1/completions", probe.key or None, body)
        message = _error_message(reply)
        seen.append(f"{what}: {status} {message[:60]!r}")
        if status != expected or not message:
            wrong.append(f"{what}: {status} (expected {expected} with a message)")
    return Result("error bodies", not wrong, "; ".join(wrong or seen))


def steps(probe: Probe, settings: Settings, max_len: int) -> list[tuple[str, Callable[[], Result]]]:
    """The API checks that apply: tool calls need the recipe's tool parser, the reasoning split
    its reasoning parser; the key check needs a key."""
    found: list[tuple[str, Callable[[], Result]]] = []
    if probe.key:
        found.append(("key", lambda: checks.check_key(probe)))
    found += [
        ("completion", lambda: checks.check_completion(probe)),
        ("chat", lambda: checks.check_chat(probe)),
        ("stream", lambda: checks.check_stream(probe)),
        ("error bodies", lambda: check_error_bodies(probe, max_len)),
    ]
    if settings.values.TOOL_PARSER:
        found.append(("tool call", lambda: checks.check_tool_call(probe)))
        found.append(("tool arguments", lambda: checks.check_tool_arguments(probe)))
    if settings.values.REASONING_PARSER:
        found.append(("reasoning", lambda: checks.check_reasoning(probe)))
    return found


def skipped(probe: Probe, settings: Settings) -> list[Result]:
    """What the API checks leave out, as results not tested (the settings claim none of it)."""
    notes = []
    if not probe.key:
        notes.append(not_tested("key", "no API_KEY: every route is open"))
    if not settings.values.TOOL_PARSER:
        notes.append(not_tested("tool call", "no TOOL_PARSER"))
    if not settings.values.REASONING_PARSER:
        notes.append(not_tested("reasoning", "no REASONING_PARSER"))
    return notes
