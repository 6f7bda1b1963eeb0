"""What verify reads off one running server: the prompt set rendered to token ids, greedy
runs with the top two log-probabilities of every generated token, and teacher-forced scores
(the server's own log-probability and rank of another run's tokens, position by position).
Everything goes through token ids (`return_tokens_as_token_ids`), so runs of different
settings line up token for token."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sparkserve.client import metrics
from sparkserve.client.server import Server, ServerError
from sparkserve.verify.prompts import PROMPTS, Prompt, document

# The long shared system message: at most this many tokens, and at most half the context
DOCUMENT_TOKENS = 8192
SCORE_TOP = 5  # log-probabilities a teacher-forced step asks for (vLLM allows 20 by default)
HEAD_PROBE_TOKENS = 32  # prompt tokens whose log-probabilities show which head ran
TOKEN_ID = "token_id:"


@dataclass(frozen=True)
class Rendered:
    prompt: Prompt
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Run:
    """One greedy generation: the tokens, each one's log-probability, and the margin of the
    choice there (its log-probability minus the runner-up's; inf where there was none)."""

    name: str
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    margins: tuple[float, ...]


@dataclass(frozen=True)
class Score:
    """A token of a run, as this server scores it at its position: its log-probability, its
    rank (1: the server's own greedy choice), and the server's own choice there (token and
    log-probability) with the runner-up's log-probability (-inf where none was listed)."""

    token: int
    logprob: float
    rank: int
    top_logprob: float
    top_token: int
    runner_up: float = -math.inf

    @property
    def margin(self) -> float:
        """The server's own choice over its runner-up."""
        return self.top_logprob - self.runner_up

    @property
    def gap(self) -> float:
        """How far the token is below the server's own choice (0 where it is that choice)."""
        return self.top_logprob - self.logprob


def _token(text: str) -> int:
    if not text.startswith(TOKEN_ID):
        raise ServerError(f"expected a token id ({TOKEN_ID}N), got {text[:40]!r}")
    return int(text[len(TOKEN_ID) :])


def render(server: Server, model: str, max_len: int, gen_tokens: int) -> list[Rendered]:
    """The prompt set as the server tokenises it. The shared document is sized to the
    context: about min(DOCUMENT_TOKENS, half the context) tokens."""
    target = min(DOCUMENT_TOKENS, max_len // 2)
    sample = 40
    per_paragraph = max(1.0, len(server.tokenize(model, document(sample))) / sample)
    paragraphs = max(1, int(target / per_paragraph))
    limit = max_len - gen_tokens - 8  # room for the reply and a teacher-forced run
    while True:
        text = document(paragraphs)
        rendered = [
            Rendered(p, tuple(server.token_ids(p.tokenize_body(model, text)))) for p in PROMPTS
        ]
        if max(len(r.ids) for r in rendered) <= limit or paragraphs == 1:
            return rendered
        paragraphs = max(1, paragraphs * 9 // 10)


def greedy(server: Server, model: str, prompt: Rendered, gen_tokens: int) -> Run:
    """`gen_tokens` greedy tokens (the end-of-sequence token does not stop it, so every
    setting generates as many) with the top two log-probabilities of each."""
    reply = server.request("/v1/completions", {
        "model": model, "prompt": list(prompt.ids), "max_tokens": gen_tokens,
        "temperature": 0, "logprobs": 2, "ignore_eos": True,
        "return_tokens_as_token_ids": True}, timeout_s=600)  # fmt: skip
    found = reply["choices"][0]["logprobs"]
    tokens = tuple(_token(t) for t in found["tokens"])
    logprobs = tuple(float(v) for v in found["token_logprobs"])
    margins = []
    for top in found["top_logprobs"]:
        values = sorted((float(v) for v in (top or {}).values()), reverse=True)
        margins.append(values[0] - values[1] if len(values) > 1 else math.inf)
    return Run(prompt.prompt.name, tokens, logprobs, tuple(margins))


def score(server: Server, model: str, prompt: Rendered, run: Run) -> list[Score]:
    """The server's scores of `run`'s tokens after the prompt (teacher forcing: each position
    sees the run's tokens before it, not the server's own), one token at a time with its top
    SCORE_TOP log-probabilities. vLLM's `prompt_logprobs` would score a run in one request,
    but its runner computes the head's logits for every prompt token of a step and casts them
    to float32 (gpu_model_runner `_get_prompt_logprobs_dict`): with the Spark's 248,320-token
    head, 8,192 tokens would take 7.6 GiB at once. One token at a time reads the prompt from
    the prefix cache where the server has one."""
    scores = []
    for position, token in enumerate(run.tokens):
        reply = server.request("/v1/completions", {
            "model": model, "prompt": [*prompt.ids, *run.tokens[:position]], "max_tokens": 1,
            "temperature": 0, "logprobs": SCORE_TOP,
            "return_tokens_as_token_ids": True}, timeout_s=600)  # fmt: skip
        top = reply["choices"][0]["logprobs"]["top_logprobs"][0] or {}
        ranked = sorted(((float(v), _token(k)) for k, v in top.items()), reverse=True)
        if not ranked:
            raise ServerError("/v1/completions: no top log-probabilities")
        found = [(rank, lp) for rank, (lp, t) in enumerate(ranked, start=1) if t == token]
        # below the listed ones: its log-probability is at most the last one listed
        rank, logprob = found[0] if found else (len(ranked) + 1, ranked[-1][0])
        runner_up = ranked[1][0] if len(ranked) > 1 else -math.inf
        scores.append(Score(token, logprob, rank, ranked[0][0], ranked[0][1], runner_up))
    return scores


# per position, the top log-probabilities as (token id, log-probability), highest first
HeadProbe = tuple[tuple[tuple[int, float], ...], ...]


def head_probe(server: Server, model: str, prompt: Rendered) -> HeadProbe:
    """The head's output on a fixed prompt, to tell which head a setting ran: the top
    SCORE_TOP log-probabilities at each of the prompt's first HEAD_PROBE_TOKENS positions
    (`prompt_logprobs`, which vLLM computes in one prefill that reads nothing from the prefix
    cache: the same arithmetic on every start of the same model). Two settings that differ
    only in the head give bit-identical probes exactly when both ran the same head."""
    ids = list(prompt.ids[:HEAD_PROBE_TOKENS])
    reply = server.request("/v1/completions", {
        "model": model, "prompt": ids, "max_tokens": 1, "temperature": 0,
        "prompt_logprobs": SCORE_TOP, "return_tokens_as_token_ids": True},
        timeout_s=600)  # fmt: skip
    found = reply["choices"][0].get("prompt_logprobs")
    if not found:
        raise ServerError("/v1/completions: no prompt_logprobs in the reply")
    positions = []
    for top in found[1:]:  # the first token has none
        pairs = ((_probe_token(k), float(v["logprob"] if isinstance(v, dict) else v))
                 for k, v in (top or {}).items())  # fmt: skip
        positions.append(tuple(sorted(pairs, key=lambda p: (-p[1], p[0]))))
    return tuple(positions)


def _probe_token(key: str) -> int:
    return _token(key) if key.startswith(TOKEN_ID) else int(key)


@dataclass(frozen=True)
class SpecCounts:
    """vLLM's spec-decode counters over a window: drafts proposed and tokens accepted."""

    drafts: float
    accepted: float


def spec_counts(server: Server, model: str, action: Any) -> SpecCounts:
    """The drafts and accepted tokens that `action()` caused, from /metrics (0 where the
    server exports no spec-decode counters: it drafted nothing)."""
    before = server.settled_metrics()
    action()
    after = server.settled_metrics()
    drafts = metrics.delta(before, after, metrics.DRAFTS, model) or 0.0
    accepted = metrics.delta(before, after, metrics.ACCEPTED, model) or 0.0
    return SpecCounts(drafts, accepted)


def prefix_hits(server: Server, action: Any) -> float:
    """Prefix-cache hits (tokens) that `action()` caused, from /metrics."""
    before = server.settled_metrics()
    action()
    after = server.settled_metrics()
    return metrics.delta(before, after, metrics.PREFIX_HITS) or 0.0
