"""The concurrency bank and how long each request is, from the server's own limits.

Pure functions. The bank defaults to 1, 2, 3 and MAX_NUM_SEQS + 1 (one request more than the
server runs at once, so one waits in the queue while the others hold the pool). Each level
splits the KV pool between its requests, capped by max-model-len, so the pool fills at every
level the context length allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparkserve.command_line import UsageError

MAX_LEVEL = 1024


class BankError(UsageError):
    """A bad bank or size; the message is one line naming the value and what is allowed."""


def default_bank(max_num_seqs: int) -> list[int]:
    bank: list[int] = []
    for level in (1, 2, 3, max_num_seqs + 1):
        if level not in bank:
            bank.append(level)
    return bank


def parse_bank(text: str, option: str = "--bank") -> list[int]:
    """'1,2,4' -> [1, 2, 4]. Whole numbers from 1 to 1024, comma-separated, no repeats."""
    rule = f"comma-separated whole numbers from 1 to {MAX_LEVEL}, each once (e.g. 1,2,3,4)"
    items = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not part.isdigit() for part in items):
        raise BankError(f"bad {option} {text!r}: must be {rule}")
    bank = [int(part) for part in items]
    if any(not 1 <= level <= MAX_LEVEL for level in bank) or len(set(bank)) != len(bank):
        raise BankError(f"bad {option} {text!r}: must be {rule}")
    return bank


@dataclass(frozen=True)
class Phase:
    concurrency: int
    prompt_tokens: int
    gen_tokens: int

    @property
    def name(self) -> str:
        return f"c={self.concurrency}"


def size_phases(
    bank: list[int],
    *,
    pool_tokens: int | None,
    max_model_len: int | None,
    gen_tokens: int,
    prompt_tokens: int | None = None,
    fill: float = 1.0,
) -> list[Phase]:
    """Each level's request sizes. Per request: the pool x fill shared by the level's
    requests, capped by max-model-len; the prompt is that minus the generation. An explicit
    `prompt_tokens` overrides the sizing (short runs, tests)."""
    if gen_tokens < 1:
        raise BankError(f"bad --gen-tokens {gen_tokens}: must be 1 or more")
    if not 0 < fill <= 4:
        raise BankError(f"bad --fill {fill}: must be above 0 and at most 4")
    phases = []
    for level in bank:
        if prompt_tokens is not None:
            prompt = prompt_tokens
        else:
            if pool_tokens is None and max_model_len is None:
                raise BankError(
                    "the server reports neither its KV pool nor max_model_len: "
                    "give --pool-tokens or --prompt-tokens"
                )
            share = math.ceil((pool_tokens or 10**12) * fill / level)
            per_request = min(share, max_model_len or share)
            prompt = per_request - gen_tokens
        if max_model_len is not None and prompt + gen_tokens > max_model_len:
            raise BankError(
                f"bad sizes: prompt {prompt} + generation {gen_tokens} tokens exceed the "
                f"server's max_model_len {max_model_len}"
            )
        if prompt < 16:
            raise BankError(
                f"bad sizes: a {prompt}-token prompt at concurrency {level}; lower "
                "--gen-tokens (the prompt must keep at least 16 tokens)"
            )
        phases.append(Phase(level, prompt, gen_tokens))
    return phases
