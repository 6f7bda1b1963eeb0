"""The verdicts: runs and scores of different settings compared, position by position. Pure
functions of what `collect` read; each returns a selftest `Result` (passed, FAILED, or not
tested with the reason) whose data holds the figures the report plots. The features compared
are the ones the settings claim, so a comparison that could not judge its feature (no int8 head
ran, no draft was proposed) is a claimed "not tested", never a pass.

Two tokens closer than `numeric_tie` (natural log) are a tie: a different order of the same
arithmetic (a batch of drafted tokens verified at once, a state read back from the prefix
cache) may pick either, and no setting is wrong to. Anything wider is a different answer.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from sparkserve.client.checks import NO_DRAFT, NO_INT8_HEAD, Result, not_tested
from sparkserve.verify.collect import HeadProbe, Run, Score, SpecCounts

NO_ACCEPTED = "no drafted token was accepted"


def first_divergence(run: Run, reference: Run) -> int | None:
    return next(
        (i for i, (a, b) in enumerate(zip(run.tokens, reference.tokens, strict=False)) if a != b),
        None,
    )


def agreement_by_position(scored: Mapping[str, Sequence[Score]]) -> list[float]:
    """Per generated position, the share of prompts whose token there is the scoring server's
    own greedy choice (rank 1)."""
    length = max((len(s) for s in scored.values()), default=0)
    shares = []
    for position in range(length):
        ranks = [s[position].rank for s in scored.values() if position < len(s)]
        shares.append(sum(1 for r in ranks if r == 1) / len(ranks))
    return shares


def speculation(
    drafted: Mapping[str, Run],
    plain: Mapping[str, Run],
    scored: Mapping[str, Sequence[Score]],
    numeric_tie: float,
    counts: SpecCounts,
) -> Result:
    """Greedy speculation is exact: every token the speculating server emitted must be the
    plain server's greedy choice at that position, or tie with it. Up to the first place the
    two free runs part, the plain server's own run chose the same tokens, the judge that takes
    the same (decode) path. From there on the plain server's teacher-forced scores judge each
    token; not before: teacher forcing runs each position as a prefill (and reads the prefix
    cache), another order of the arithmetic than decoding, and on an H100 with random weights
    it disowned a token the plain server's own free run chose, by 0.151 (docs/FINDINGS.md,
    "verify: compare like with like"). `counts`: the spec-decode counters over the speculating
    runs. No draft proposed (a drafter that never proposes): nothing speculative ran, so
    speculation is not tested, whatever the tokens (a difference from the plain model is named
    in the detail, but it is not speculation's). Drafts proposed: a wrong token fails, whether
    any draft was accepted or none; with no wrong token and none accepted, no drafted token
    reached the output: not tested."""
    wrong, notes = [], []
    for name, scores in scored.items():
        at = first_divergence(drafted[name], plain[name])
        judged_from = len(scores) if at is None else at
        bad = [i for i, s in enumerate(scores)
               if i >= judged_from and s.rank != 1 and s.gap > numeric_tie]  # fmt: skip
        if at is None:
            notes.append(f"{name}: identical")
        else:
            notes.append(f"{name}: parts at token {at} (margin {plain[name].margins[at]:.3f})")
        if bad:
            worst = max(scores[i].gap for i in bad)
            wrong.append(f"{name}: {len(bad)} of {len(scores)} tokens not the plain model's "
                         f"choice, first at {bad[0]}, up to {worst:.3f} below it")  # fmt: skip
    agreement = agreement_by_position(scored)
    data = {"agreement_by_position": agreement, "first_divergence": {
        name: first_divergence(drafted[name], plain[name]) for name in scored}}  # fmt: skip
    data["drafts"], data["accepted"] = counts.drafts, counts.accepted
    drafted = f"{counts.drafts:.0f} drafts, {counts.accepted:.0f} tokens accepted"
    data["wrong"] = len(wrong)
    if not counts.drafts:
        detail = f"{drafted} over the runs judged ({'; '.join(wrong + notes)})"
        return not_tested("speculation vs plain", NO_DRAFT, detail, claimed=True, data=data)
    if wrong:
        detail = f"{'; '.join(wrong)} ({drafted}; {'; '.join(notes)})"
        return Result("speculation vs plain", False, detail, data, claimed=True)
    if not counts.accepted:
        detail = f"{drafted} over the runs judged ({'; '.join(notes)})"
        return not_tested("speculation vs plain", NO_ACCEPTED, detail, claimed=True, data=data)
    detail = f"every emitted token is the plain model's choice ({drafted}; {'; '.join(notes)})"
    return Result("speculation vs plain", True, detail, data, claimed=True)


def int8_head(
    reference: Mapping[str, Sequence[Score]],
    scored: Mapping[str, Sequence[Score]],
    max_delta: float,
    probes: tuple[HeadProbe | None, HeadProbe | None] = (None, None),
) -> Result:
    """Both heads score the bf16 head's greedy tokens with the same requests (teacher-forced):
    `reference` by the bf16 head, `scored` by the int8 head, so only the head differs. At
    every position the int8 head's own choice must be the bf16 head's, but where the bf16
    head's margin is within 2 x max_delta (two log-probabilities each moved by max_delta can
    swap), and the token's log-probability may move by max_delta at most. A greedy run is no
    reference for a teacher-forced score: the two take different paths (0.18 apart on an H100
    with random weights, where the heads' greedy runs agreed within 0.024).

    `probes`: the bf16 and the int8 setting's `collect.head_probe`, the same prefill in both.
    Bit-identical, both ran the same head (the plugin kept bf16, as its calibration may off
    CUDA): no int8 head ran, not tested."""
    deltas, wrong, positions, agreed = [], [], 0, 0
    shares: dict[int, list[bool]] = {}
    for name, scores in scored.items():
        for i, (s, ref) in enumerate(zip(scores, reference[name], strict=True)):
            positions += 1
            deltas.append(abs(s.logprob - ref.logprob))
            same = s.top_token == ref.top_token
            agreed += same
            shares.setdefault(i, []).append(same)
            if not same and ref.margin > 2 * max_delta:
                wrong.append(f"{name} token {i} (bf16 margin {ref.margin:.3f})")
    agreement = [sum(v) / len(v) for _, v in sorted(shares.items())]
    largest = max(deltas, default=0.0)
    mean = statistics.fmean(deltas) if deltas else 0.0
    detail = (f"top-1 agreement {agreed} of {positions}; |delta logprob| largest "
              f"{largest:.4f}, mean {mean:.4f} (limit {max_delta:g})")  # fmt: skip
    data = {"agreement_by_position": agreement, "agreed": agreed, "positions": positions,
            "largest_delta": largest, "mean_delta": mean, "max_delta": max_delta}  # fmt: skip
    bf16_probe, int8_probe = probes
    same_head = bf16_probe is not None and bf16_probe == int8_probe
    data["head_probe_positions"] = len(int8_probe) if int8_probe is not None else 0
    data["head_probe_identical"] = same_head
    if not positions or largest == 0.0 or same_head:
        # both settings ran the bf16 head (the plugin's calibration may pick bf16 off CUDA):
        # there is no int8 head to judge
        why = "nothing scored"
        if same_head:
            why = (f"the int8 setting's prompt log-probabilities are bit-identical to the bf16 "
                   f"head's ({len(bf16_probe or ())} positions), see the server's log")  # fmt: skip
        elif positions:
            why = "bit-identical to bf16, see the server's log"
        return not_tested("int8 head vs bf16", NO_INT8_HEAD, f"{detail}; {why}", True, data)
    if wrong:
        detail += f"; a clear choice changed at {', '.join(wrong[:3])}"
        detail += f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
    return Result("int8 head vs bf16", not wrong and largest <= max_delta, detail, data,
                  claimed=True)  # fmt: skip


def same_runs(name: str, runs: Mapping[str, Run], reference: Mapping[str, Run],
              numeric_tie: float) -> Result:  # fmt: skip
    """Two settings' free greedy runs: identical, or parting only at a tie of the reference."""
    notes, wrong = [], []
    for prompt, ref in reference.items():
        at = first_divergence(runs[prompt], ref)
        if at is None:
            continue
        margin = ref.margins[at]
        (wrong if margin > numeric_tie else notes).append(
            f"{prompt} parts at token {at} (margin {margin:.3f})"
        )
    same = len(reference) - len(wrong) - len(notes)
    detail = f"{same} of {len(reference)} prompts identical"
    if notes:
        detail += f"; at a tie: {', '.join(notes)}"
    if wrong:
        detail += f"; different: {', '.join(wrong)}"
    return Result(name, not wrong, detail)


def prefix_caching(repeat_hits: float, repeated: Result, off: Result) -> Result:
    """Prefix caching on: a repeated shared prefix hits the cache (vLLM #45238's silent 0%
    fails), the repeat answers as the first send did, and the server without the cache
    answers as the one with it."""
    ok = repeat_hits > 0 and repeated.ok is not False and off.ok is not False
    detail = (f"{repeat_hits:.0f} tokens hit on the repeated prefix; repeat: {repeated.detail}; "
              f"cache off: {off.detail}")  # fmt: skip
    return Result("prefix caching vs off", ok, detail, {"repeat_hits": repeat_hits},
                  claimed=True)  # fmt: skip
