"""The selftest's greedy comparison (a divergence is a failure only where the reference's
choice was clear; elsewhere it is reported with its place and margin) and the unit its prefix
check counts hits in. Its servers are tests/e2e/test_selftest_container.py's."""

from __future__ import annotations

from sparkserve.selftest.checks import CLEAR_MARGIN, compare_greedy, hit_unit


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


# vLLM 0.33.0's lines on the H200 (docs/data/runs/2026-12-04-selftest-h200.md): the Spark
# geometry with its DFlash drafter, then without a drafter
DFLASH_LOG = """(EngineCore pid=2042) INFO 12-04 17:55:58 [kv_cache_utils.py:865] kv cache group sizes (2240, 2240, 2240, 4480, 2240, 2240, 2240)
(EngineCore pid=2042) INFO 12-04 17:55:58 [kv_cache_utils.py:866] kv lcm block sizes 4480
"""  # noqa: E501
PLAIN_LOG = (
    "(EngineCore pid=832) INFO 12-04 17:51:00 [kv_cache_utils.py:866] kv lcm block sizes 2096\n"
)


def test_prefix_hits_are_counted_in_the_groups_least_common_block() -> None:
    unit, why = hit_unit(DFLASH_LOG, 2240)
    assert unit == 4480
    assert why == ("hits land on 4480-token boundaries (the least common multiple of the KV "
                   "cache groups' blocks, 2240 and 4480)")  # fmt: skip
    assert hit_unit(PLAIN_LOG, 2096) == (2096, "")
    assert hit_unit("", 128) == (128, "")  # one group: vLLM logs no multiple


# The same two lines for the layout the hybrid-page-divide patch gives (the group blocks that
# tests/patching/test_page_divide.py's scenario gets from vLLM's own functions)
DIVIDED_LOG = """(EngineCore pid=2042) INFO 12-06 01:40:00 [kv_cache_utils.py:865] kv cache group sizes (2240, 2240, 2240, 2240, 2240, 2240, 2240, 2240, 1120)
(EngineCore pid=2042) INFO 12-06 01:40:00 [kv_cache_utils.py:866] kv lcm block sizes 2240
"""  # noqa: E501


def test_prefix_hits_below_the_mamba_block_are_counted_in_the_groups_common_divisor() -> None:
    unit, why = hit_unit(DIVIDED_LOG, 2240)
    assert unit == 1120
    assert why == ("hits land on 1120-token boundaries (the greatest common divisor of the KV "
                   "cache groups' blocks, 1120 and 2240: vLLM's sub-block hits)")  # fmt: skip
    # the stock layout's divisor is its cache block: no sub-block hits, the multiple stays
    assert hit_unit(DFLASH_LOG, 2240)[0] == 4480
