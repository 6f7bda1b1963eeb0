"""The concurrency bank and the request sizes of each level (sparkserve.client.bank)."""

from __future__ import annotations

import pytest

from sparkserve.client.bank import BankError, default_bank, parse_bank, size_phases


def test_default_bank_is_1_2_3_and_one_over_max_num_seqs() -> None:
    assert default_bank(3) == [1, 2, 3, 4]
    assert default_bank(8) == [1, 2, 3, 9]
    assert default_bank(1) == [1, 2, 3]


@pytest.mark.parametrize("text", ["", "0", "1,x", "2,,3", "1,1", "-1", "1.5", "2000", " , "])
def test_bad_bank_is_one_clear_line(text: str) -> None:
    with pytest.raises(BankError) as info:
        parse_bank(text)
    message = str(info.value)
    assert repr(text) in message and "whole numbers from 1 to 1024" in message
    assert "\n" not in message


def test_bank_parses() -> None:
    assert parse_bank("1, 2,4") == [1, 2, 4]


def test_phases_fill_the_pool_within_max_model_len() -> None:
    # The design note's Spark: 421,888-token pool, 262,144 max-model-len, MAX_NUM_SEQS 3.
    phases = size_phases([1, 2, 3, 4], pool_tokens=421_888, max_model_len=262_144, gen_tokens=2048)
    per_request = [p.prompt_tokens + p.gen_tokens for p in phases]
    assert per_request == [262_144, 210_944, 140_630, 105_472]
    for phase, total in zip(phases, per_request, strict=True):
        assert total <= 262_144
        assert phase.concurrency == 1 or phase.concurrency * total >= 421_888
    fixed = size_phases([2], pool_tokens=None, max_model_len=4096, gen_tokens=8, prompt_tokens=100)
    assert (fixed[0].prompt_tokens, fixed[0].gen_tokens) == (100, 8)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"pool_tokens": 1000, "max_model_len": 4096, "gen_tokens": 0}, "--gen-tokens"),
        ({"pool_tokens": None, "max_model_len": None, "gen_tokens": 8}, "--pool-tokens"),
        ({"pool_tokens": 100, "max_model_len": 4096, "gen_tokens": 90}, "16 tokens"),
        (
            {"pool_tokens": 9, "max_model_len": 4096, "gen_tokens": 8, "prompt_tokens": 5000},
            "max_model_len 4096",
        ),
        ({"pool_tokens": 1000, "max_model_len": 4096, "gen_tokens": 8, "fill": 0}, "--fill"),
    ],
)
def test_bad_sizes(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(BankError, match=needle):
        size_phases([1], **kwargs)  # type: ignore[arg-type]
