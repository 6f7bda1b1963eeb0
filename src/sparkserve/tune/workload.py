"""The draft loop's workload and its measurement: the prompts (bench's kinds, or the user's own
from a JSONL file), sent one at a time after an uncounted warm-up request, greedy, each
generating the same number of tokens; decode tokens per second over the whole workload and the
speculative acceptance per draft position from the server's /metrics counters around it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkserve.client import metrics
from sparkserve.client import prompts as seeded_prompts
from sparkserve.client.server import Server, StreamResult
from sparkserve.client.tool import RunAborted
from sparkserve.command_line import UsageError

WARM_UP_TOKENS = 16


@dataclass(frozen=True)
class Prompt:
    text: str  # a completion prompt, or the one user message of a chat request
    source: str


def kind_prompts(kinds: tuple[str, ...], per_kind: int) -> list[Prompt]:
    return [
        Prompt(seeded_prompts.prompt(kind, v), f"{kind}#{v}")
        for kind in kinds
        for v in range(per_kind)
    ]


def file_prompts(path: Path) -> list[Prompt]:
    """One JSON object a line with a "prompt" string (blank lines skipped)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise UsageError(f"bad --prompts-file {str(path)!r}: {exc.strerror}") from None
    found: list[Prompt] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            text = item["prompt"]
        except (ValueError, KeyError, TypeError):
            text = None
        if not isinstance(text, str) or not text:
            raise UsageError(
                f"bad --prompts-file {str(path)!r}: line {number} is not a JSON object with a "
                'non-empty "prompt" string'
            )
        found.append(Prompt(text, f"{path.name}:{number}"))
    if not found:
        raise UsageError(f"bad --prompts-file {str(path)!r}: holds no prompt")
    return found


def measure(
    server: Server,
    model: str,
    workload: list[Prompt],
    gen_tokens: int,
    api: str,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Tokens per second (decode: after each request's first token) and acceptance."""
    send = server.stream_chat if api == "chat" else server.stream_completion
    # One short request first, not counted: the first after a start pays one-time costs (the
    # ngram drafter's JIT compile, lazy allocations) that no later request does.
    warm = send(model, workload[0].text, WARM_UP_TOKENS, ignore_eos=True)
    if warm.error:
        raise RunAborted(f"{workload[0].source}: {warm.error}")
    before = server.settled_metrics()
    results: list[StreamResult] = []
    for prompt in workload:
        result = send(model, prompt.text, gen_tokens, ignore_eos=True)
        if result.error:
            raise RunAborted(f"{prompt.source}: {result.error}")
        results.append(result)
    after = server.settled_metrics()
    tokens = sum(max(r.completion_tokens - 1, 0) for r in results)
    span = sum(
        (r.last_token - r.first_token)
        for r in results
        if r.first_token is not None and r.last_token is not None
    )
    spec = metrics.acceptance(before, after, model)
    row = {
        "requests": len(results),
        "decode_tokens": tokens,
        "decode_s": span,
        "tok_s": tokens / span if span > 0 else None,
        "spec": spec,
    }
    say(
        f"[tune] {len(results)} request(s): {row['tok_s'] or 0:.1f} tok/s, acceptance length "
        f"{spec['mean_acceptance_length'] or 1:.2f}"
    )
    return row
