"""The selftest's greedy comparison: a divergence is a failure only where the reference's
choice was clear; elsewhere it is reported with its place and margin. Its servers are
tests/e2e/test_selftest_container.py's."""

from __future__ import annotations

from sparkserve.selftest.checks import CLEAR_MARGIN, compare_greedy


def run(tokens: list[str], tops: list[dict[str, float]]) -> dict:
    return {"tokens": tokens, "top": tops}


REFERENCE = [run(["a", "b", "c"], [{"a": -0.1, "x": -3.0}, {"b": -1.0, "y": -1.05},
                                  {"c": -0.2, "z": -2.5}])]  # fmt: skip


def test_identical_paths_pass() -> None:
    result = compare_greedy("greedy vs plain", [run(["a", "b", "c"], [])], REFERENCE)
    assert (result.ok, result.detail) == (True, "prompt 1: identical")


def test_a_divergence_where_the_reference_hesitated_is_reported_not_failed() -> None:
    result = compare_greedy("greedy vs plain", [run(["a", "y", "c"], [])], REFERENCE)
    assert result.ok is None
    assert result.detail == "prompt 1: token 1, margin 0.050"


def test_a_divergence_from_a_clear_choice_fails() -> None:
    for token in (0, 2):
        tokens = ["a", "b", "c"]
        tokens[token] = "q"
        result = compare_greedy("greedy vs bf16", [run(tokens, [])], REFERENCE)
        assert result.ok is False, result
        margin = float(result.detail.rsplit(" ", 1)[1])
        assert margin > CLEAR_MARGIN and result.detail.startswith(f"prompt 1: token {token},")
