"""Prometheus text and counter deltas (sparkserve.client.metrics)."""

from __future__ import annotations

import pytest

from sparkserve.client import metrics


def test_pool_size_from_metrics_and_log() -> None:
    text = (
        'vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="1024",'
        'kv_cache_size_tokens="59918"} 1.0\n'
    )
    assert metrics.cache_pool_tokens(metrics.parse(text)) == 59918
    older = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0\n'
    assert metrics.cache_pool_tokens(metrics.parse(older)) == 1600
    assert metrics.cache_pool_tokens({}) is None
    log = "INFO [kv_cache_utils.py:1147] GPU KV cache size: 421,888 tokens, Maximum ..."
    assert metrics.pool_tokens_from_log(log) == 421_888
    assert metrics.pool_tokens_from_log("CPU KV cache size: 59,918 tokens") == 59918


BEFORE = """
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="10"} 0.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_hits_total{engine="0",model_name="other"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 2.0
"""


AFTER = """
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 70.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 120.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 27.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 17.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="10"} 2.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 3000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1600.0
vllm:prefix_cache_hits_total{engine="0",model_name="other"} 900.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.5
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 5.0
"""


def test_acceptance_from_counter_deltas() -> None:
    acc = metrics.acceptance(metrics.parse(BEFORE), metrics.parse(AFTER), "m")
    assert acc["drafts"] == 20 and acc["accepted"] == 50 and acc["draft_tokens"] == 80
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 50 / 20)
    # Positions in numeric order (10 after 1), each accepted / drafts (no plugin counter here).
    assert acc["acceptance_per_position"] == pytest.approx([18 / 20, 10 / 20, 2 / 20])
    assert acc["acceptance_per_position_of"] == "all drafts"


# sparkserve.in_vllm.spec_metrics's counter: of the 20 drafts in the window, 20 had a token at
# position 0, 12 at position 1 and none at position 10
REACHED_BEFORE = """
sparkserve_spec_decode_num_drafts_per_pos_total{engine="0",model_name="m",position="0"} 10.0
sparkserve_spec_decode_num_drafts_per_pos_total{engine="0",model_name="m",position="1"} 8.0
sparkserve_spec_decode_num_drafts_per_pos_total{engine="0",model_name="m",position="10"} 1.0
"""
REACHED_AFTER = """
sparkserve_spec_decode_num_drafts_per_pos_total{engine="0",model_name="m",position="0"} 30.0
sparkserve_spec_decode_num_drafts_per_pos_total{engine="0",model_name="m",position="1"} 20.0
sparkserve_spec_decode_num_drafts_per_pos_total{engine="0",model_name="m",position="10"} 1.0
"""


def test_acceptance_per_position_divides_by_the_drafts_that_reached_it() -> None:
    acc = metrics.acceptance(metrics.parse(BEFORE + REACHED_BEFORE),
                             metrics.parse(AFTER + REACHED_AFTER), "m")  # fmt: skip
    # position 10: 2 accepted but no draft reached it in the window: no rate, not a zero
    assert acc["acceptance_per_position"] == pytest.approx([18 / 20, 10 / 12, None])
    assert acc["acceptance_per_position_of"] == "drafts that reached it"
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 50 / 20)


def test_hit_rate_and_histogram_mean_from_deltas() -> None:
    before, after = metrics.parse(BEFORE), metrics.parse(AFTER)
    assert metrics.prefix_hit_rate(before, after, "m") == {
        "queries": 2000.0, "hits": 1500.0, "hit_rate": 0.75,
    }  # fmt: skip
    assert metrics.histogram_mean(
        before, after, "vllm:time_to_first_token_seconds", "m"
    ) == pytest.approx(0.5)
    assert metrics.histogram_mean(after, after, "vllm:time_to_first_token_seconds") is None
