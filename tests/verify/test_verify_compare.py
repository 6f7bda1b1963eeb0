"""verify's verdicts on runs and scores made by hand: what each check passes, what it fails,
that a tie (two log-probabilities closer than the limit) is not a failure, and that a feature
that did not run (no int8 head, no draft proposed or accepted) is "not tested", claimed, never
passed."""

from __future__ import annotations

import math

from sparkserve import command_line as cl
from sparkserve.client.checks import exit_status, mark
from sparkserve.verify import compare
from sparkserve.verify.collect import Run, Score, SpecCounts

TIE = 0.05
DRAFTED = SpecCounts(drafts=40.0, accepted=25.0)  # a window where drafts were accepted


def run(name: str, tokens: list[int], margins: list[float] | None = None,
        logprobs: list[float] | None = None) -> Run:  # fmt: skip
    margins = margins or [2.0] * len(tokens)
    logprobs = logprobs or [-0.5] * len(tokens)
    return Run(name, tuple(tokens), tuple(logprobs), tuple(margins))


def top(token: int, logprob: float = -0.5, margin: float = 2.0) -> Score:
    """The token is the scoring server's own choice, `margin` over its runner-up."""
    return Score(token, logprob, 1, logprob, token, logprob - margin)


def below(token: int, gap: float, top_logprob: float = -0.5, choice: int = 999) -> Score:
    """The server chose `choice`, `gap` over this token, its runner-up."""
    return Score(token, top_logprob - gap, 2, top_logprob, choice, top_logprob - gap)


def test_speculation_passes_when_every_drafted_token_is_the_plain_choice() -> None:
    drafted = {"a": run("a", [1, 2, 3])}
    plain = {"a": run("a", [1, 2, 3])}
    result = compare.speculation(drafted, plain, {"a": [top(1), top(2), top(3)]}, TIE, DRAFTED)
    assert result.ok is True
    assert "identical" in result.detail
    assert result.data["agreement_by_position"] == [1.0, 1.0, 1.0]


def test_speculation_at_a_tie_passes_and_reports_where_the_runs_part() -> None:
    drafted = {"a": run("a", [1, 9, 4])}
    plain = {"a": run("a", [1, 2, 3], margins=[2.0, 0.01, 2.0])}
    result = compare.speculation(
        drafted, plain, {"a": [top(1), below(9, 0.01), top(4)]}, TIE, DRAFTED
    )
    assert result.ok is True
    assert "a: parts at token 1 (margin 0.010)" in result.detail
    assert result.data["first_divergence"] == {"a": 1}


def test_speculation_fails_on_a_token_the_plain_model_would_not_choose() -> None:
    drafted = {"a": run("a", [1, 9, 4]), "b": run("b", [5])}
    plain = {"a": run("a", [1, 2, 3]), "b": run("b", [5])}
    scores = {"a": [top(1), below(9, 1.5), below(4, 0.2)], "b": [top(5)]}
    result = compare.speculation(drafted, plain, scores, TIE, DRAFTED)
    assert result.ok is False
    assert "a: 2 of 3 tokens not the plain model's choice, first at 1, up to 1.500" in result.detail
    assert result.data["agreement_by_position"] == [1.0, 0.0, 0.0]


def test_speculation_judges_by_teacher_forcing_only_where_the_free_runs_part() -> None:
    # an H100 with random weights: the free runs identical, yet teacher forcing (a prefill
    # per position) put the plain run's own token 0.151 below its choice: not speculation's
    same = {"a": run("a", [1, 2, 3])}
    path = {"a": [top(1), below(2, 0.151), top(3)]}
    result = compare.speculation(same, same, path, 0.15, DRAFTED)
    assert result.ok is True and "a: identical" in result.detail, result.detail
    # once the runs part, teacher forcing judges that position and every one after it
    drafted, plain = {"a": run("a", [1, 2, 7])}, {"a": run("a", [1, 2, 3])}
    after = {"a": [top(1), below(2, 0.151), below(7, 0.4)]}
    result = compare.speculation(drafted, plain, after, 0.15, DRAFTED)
    assert result.ok is False
    assert "a: 1 of 3 tokens not the plain model's choice, first at 2, up to 0.400" in (
        result.detail
    )


def test_int8_head_passes_within_the_limit_and_reports_agreement_and_deltas() -> None:
    reference = {"a": [top(1, -0.5), top(2, -1.0)]}
    scores = {"a": [top(1, -0.52), top(2, -0.97)]}
    result = compare.int8_head(reference, scores, max_delta=0.1)
    assert result.ok is True
    assert math.isclose(result.data["largest_delta"], 0.03)
    assert math.isclose(result.data["mean_delta"], 0.025)
    assert result.data["agreed"] == 2 and result.data["positions"] == 2
    assert "top-1 agreement 2 of 2" in result.detail


def test_int8_head_fails_on_a_delta_past_the_limit() -> None:
    reference = {"a": [top(1, -0.5)]}
    result = compare.int8_head(reference, {"a": [top(1, -0.8)]}, max_delta=0.1)
    assert result.ok is False and "largest 0.3000" in result.detail


def test_int8_head_tolerates_a_swap_only_where_the_bf16_margin_allows_it() -> None:
    near = {"a": [top(1, -0.5, margin=0.15)]}
    swapped = {"a": [below(1, 0.04, top_logprob=-0.45)]}  # rank 2, moved by 0.01
    assert compare.int8_head(near, swapped, max_delta=0.1).ok is True
    clear = {"a": [top(1, -0.5, margin=0.5)]}
    result = compare.int8_head(clear, swapped, max_delta=0.1)
    assert result.ok is False and "a clear choice changed at a token 0" in result.detail


def test_same_runs_fails_only_where_the_reference_was_clear() -> None:
    reference = {"a": run("a", [1, 2], margins=[2.0, 0.01]), "b": run("b", [3, 4])}
    at_tie = {"a": run("a", [1, 7]), "b": run("b", [3, 4])}
    result = compare.same_runs("cache off", at_tie, reference, TIE)
    assert result.ok is True and "1 of 2 prompts identical; at a tie: a parts at token 1" in (
        result.detail
    )
    different = {"a": run("a", [1, 2]), "b": run("b", [8, 4])}
    result = compare.same_runs("cache off", different, reference, TIE)
    assert result.ok is False and "different: b parts at token 0 (margin 2.000)" in result.detail


def test_prefix_caching_fails_on_zero_hits_even_with_identical_outputs() -> None:
    same = compare.same_runs("x", {"a": run("a", [1])}, {"a": run("a", [1])}, TIE)
    assert compare.prefix_caching(2240.0, same, same).ok is True
    silent = compare.prefix_caching(0.0, same, same)  # vLLM #45238: no hits, same answers
    assert silent.ok is False and "0 tokens hit" in silent.detail


def test_int8_head_bit_identical_to_bf16_is_not_tested_and_keeps_verify_from_passing() -> None:
    reference = {"a": [top(1, -0.5), top(2, -1.0)]}
    result = compare.int8_head(reference, {"a": [top(1, -0.5), top(2, -1.0)]}, max_delta=0.1)
    assert result.ok is None and result.claimed
    assert result.detail.startswith("not tested: no int8 head ran; top-1 agreement 2 of 2")
    assert mark(result.ok) == "not tested"
    assert exit_status([result]) == cl.EXIT_NOT_TESTED != cl.EXIT_OK


def probe(*logprobs: float) -> tuple[tuple[tuple[int, float], ...], ...]:
    return tuple(((7, lp), (8, lp - 1.0)) for lp in logprobs)


def test_int8_head_whose_probe_matches_the_bf16_heads_is_not_tested_though_scores_differ() -> None:
    # the bf16 plugin path in both settings: the scores may differ (each position a request of
    # its own, batched and cached as the server goes) but the probes, one prefill each, do not
    reference = {"a": [top(1, -0.5), top(2, -1.0)]}
    scored = {"a": [top(1, -0.52), top(2, -0.99)]}
    same = (probe(-0.25, -1.5), probe(-0.25, -1.5))
    result = compare.int8_head(reference, scored, max_delta=0.1, probes=same)
    assert result.ok is None and result.claimed and mark(result.ok) == "not tested"
    assert result.detail.startswith("not tested: no int8 head ran; top-1 agreement 2 of 2")
    assert "bit-identical to the bf16 head's (2 positions)" in result.detail
    assert result.data["head_probe_identical"] is True
    assert exit_status([result]) == cl.EXIT_NOT_TESTED
    # the int8 head ran (its probe differs in the last bit): judged, and passed
    ran = (probe(-0.25, -1.5), probe(-0.25, -1.5000001))
    judged = compare.int8_head(reference, scored, max_delta=0.1, probes=ran)
    assert judged.ok is True and judged.data["head_probe_identical"] is False
    # and a broken one still fails
    broken = compare.int8_head(reference, {"a": [top(1, -0.9), top(2, -1.0)]}, 0.1, ran)
    assert broken.ok is False and exit_status([broken]) == cl.EXIT_FAILED


def test_speculation_with_no_draft_proposed_is_not_tested_though_the_runs_agree() -> None:
    same = {"a": run("a", [1, 2, 3])}
    scores = {"a": [top(1), top(2), top(3)]}
    for counts, reason in ((SpecCounts(0.0, 0.0), "no draft was proposed"),
                           (SpecCounts(30.0, 0.0), "no drafted token was accepted")):  # fmt: skip
        result = compare.speculation(same, same, scores, TIE, counts)
        assert result.ok is None and result.claimed, result
        assert result.detail.startswith(f"not tested: {reason}; "), result.detail
        assert exit_status([result]) == cl.EXIT_NOT_TESTED


def test_a_wrong_token_fails_speculation_where_drafts_were_proposed_accepted_or_not() -> None:
    drafted, plain = {"a": run("a", [1, 9])}, {"a": run("a", [1, 2])}
    scores = {"a": [top(1), below(9, 1.5)]}
    for counts in (DRAFTED, SpecCounts(30.0, 0.0)):  # accepted, and proposed but none accepted
        result = compare.speculation(drafted, plain, scores, TIE, counts)
        assert result.ok is False and mark(result.ok) == "FAILED", result
        assert "not the plain model's choice" in result.detail
        assert exit_status([result]) == cl.EXIT_FAILED


def test_a_drafter_that_never_proposes_is_not_tested_even_where_the_tokens_differ() -> None:
    # no draft proposed: nothing speculative ran, so a difference is not speculation's; it is
    # named in the detail, and the check is a claim not tested (exit 5), neither ok nor FAILED
    drafted, plain = {"a": run("a", [1, 9])}, {"a": run("a", [1, 2])}
    scores = {"a": [top(1), below(9, 1.5)]}
    result = compare.speculation(drafted, plain, scores, TIE, SpecCounts(0.0, 0.0))
    assert result.ok is None and result.claimed and mark(result.ok) == "not tested"
    assert result.detail.startswith("not tested: no draft was proposed; 0 drafts"), result.detail
    assert "1 of 2 tokens not the plain model's choice" in result.detail
    assert result.data["wrong"] == 1
    assert exit_status([result]) == cl.EXIT_NOT_TESTED


def test_a_pass_reports_the_drafts_it_judged() -> None:
    same = {"a": run("a", [1, 2])}
    result = compare.speculation(same, same, {"a": [top(1), top(2)]}, TIE, DRAFTED)
    assert result.ok is True and "40 drafts, 25 tokens accepted" in result.detail
    assert result.data["drafts"] == 40.0 and exit_status([result]) == cl.EXIT_OK
