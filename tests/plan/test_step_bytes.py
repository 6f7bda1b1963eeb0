"""The bytes-per-decode-step model (sparkserve.plan.step_bytes) against counts made by hand.

The tiny geometry's figures below are counted by hand, tensor by tensor (the arithmetic is in
the comments), not computed with the module's formulas; the int8 head's share is checked on
the shipped recipe's real vocab x hidden.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkserve.plan.step_bytes import (
    StepBytesError,
    ceiling_tok_s,
    experts_touched,
    geometry,
    quantization,
    step_bytes,
    table,
)

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "qwen3.5-122b-a10b" / "config.json"

TINY = {
    "hidden_size": 8, "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
    "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 4,
    "linear_value_head_dim": 4, "linear_conv_kernel_dim": 2, "num_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 8, "shared_expert_intermediate_size": 8,
    "vocab_size": 16, "mamba_ssm_dtype": "float32",
}  # fmt: skip

# By hand, bf16 weights (2 B), hidden 8, context 10, one stream:
HAND_ONE_STREAM = {
    # q 16x8 (2 heads x 4 x 2 for the output gate) 256 + k,v 2 x 4x8 x2 128 + o 8x8 128
    # + q/k norms 2 x 4 x2 16 = 528, one full-attention layer
    "attention": 528,
    # qkvz 24x8 x2 384 + b 2x8 x2 32 + a 32 + conv 16x2 x2 64 + A_log,dt_bias 2x2 x4 16
    # + norm 4 x2 8 + out 8x8 x2 128 = 664, three GDN layers
    "gdn": 1992,
    # one expert: gate, up, down 3 x 8x8 x2 = 384; 2 per token, 4 layers
    "routed_experts": 3072,
    # 384 + the shared gate 8 x2 16 = 400, 4 layers
    "shared_experts": 1600,
    "router": 256,  # 4 experts x 8 x2, 4 layers
    "norms": 144,  # (2 per layer x 4 + final) x 8 x2
    "embedding_rows": 16,  # one row, 8 x2
    "lm_head": 256,  # 16 x 8 x2 (bf16)
    "kv_cache": 160,  # 10 tokens x (1 layer x K,V x 1 head x 4 x2 = 16)
    # per GDN layer: SSM 2 heads x 4 x 4 x4 (float32) 128 + conv (2x4 + 8 = 16) x 1 x2 32
    "gdn_state": 480,
}


def test_the_tiny_geometry_matches_a_count_by_hand() -> None:
    step = step_bytes(geometry(TINY), None, head="bf16", context=10, streams=1)
    assert step.by_kind == pytest.approx(HAND_ONE_STREAM)
    assert step.total == 8504


def test_two_streams_read_the_union_of_experts_and_their_own_caches() -> None:
    step = step_bytes(geometry(TINY), None, head="bf16", context=10, streams=2)
    # 4 x (1 - (1 - 2/4)^2) = 3 experts a layer: 3 x 384 x 4 layers
    assert step.by_kind["routed_experts"] == pytest.approx(4608)
    assert step.by_kind["kv_cache"] == 320 and step.by_kind["gdn_state"] == 960
    assert step.by_kind["embedding_rows"] == 32
    assert step.by_kind["attention"] == 528  # weights: once per step
    assert experts_touched(256, 8, 1) == 8
    assert 8 < experts_touched(256, 8, 8) < 64 < experts_touched(256, 8, 64) < 256


def test_int4_weights_read_half_a_byte_and_a_scale_per_group() -> None:
    config = {
        **TINY,
        "quantization_config": {
            "quant_method": "auto-round", "bits": 4, "group_size": 8, "sym": True,
            "extra_config": {
                r"linear_attn\.in_proj_[ab]$": {"bits": 16},
                r"mlp\.shared_expert\.(gate|up|down)_proj$": {"bits": 16},
            },
        },
    }  # fmt: skip
    step = step_bytes(geometry(config), quantization(config), head="bf16", context=0)
    # 0.5 B + 2 B / 8 = 0.75 B a weight: one expert 3 x 64 x 0.75 = 144, x 2 x 4 layers
    assert step.by_kind["routed_experts"] == pytest.approx(1152)
    # the shared expert's three projections kept at 16 bits: the bf16 count by hand
    assert step.by_kind["shared_experts"] == pytest.approx(HAND_ONE_STREAM["shared_experts"])
    unkept = {**config["quantization_config"], "extra_config": {}}
    plain = step_bytes(geometry(config), quantization({**config, "quantization_config": unkept}))
    assert plain.by_kind["shared_experts"] == pytest.approx(4 * (3 * 64 * 0.75 + 16))
    # qkvz 192 x 0.75 144 + b,a kept 32 + 32 + conv 64 + 16 + norm 8 + out 64 x 0.75 48
    assert step.by_kind["gdn"] == pytest.approx(3 * 344)


def test_the_int8_heads_share_comes_from_the_real_vocab_and_hidden() -> None:
    config = json.loads(RECIPE.read_text())
    assert (config["vocab_size"], config["hidden_size"]) == (248320, 3072)
    quant = quantization(config)
    assert quant is not None and (quant.bits, quant.group_size) == (4, 128)
    bf16 = step_bytes(geometry(config), quantization(config), head="bf16")
    int8 = step_bytes(geometry(config), quantization(config), head="int8")
    # bf16: 248320 x 3072 x 2 B = 1.421 GiB (shared FACTS); int8: a byte each + a float32 a row
    assert bf16.by_kind["lm_head"] == 1_525_678_080
    assert int8.by_kind["lm_head"] == 248320 * 3076
    assert bf16.total - int8.total == 1_525_678_080 - 248320 * 3076
    assert int8.share("lm_head") == int8.by_kind["lm_head"] / int8.total
    assert 0.10 < int8.share("lm_head") < bf16.share("lm_head") < 0.30
    # the head is the only difference, so the ceilings differ by the bytes' ratio
    assert ceiling_tok_s(int8, 273) / ceiling_tok_s(bf16, 273) == pytest.approx(
        bf16.total / int8.total
    )


def test_the_recipe_table_rows_are_labelled_and_grow_with_context() -> None:
    rows = table(json.loads(RECIPE.read_text()), contexts=(0, 32768), heads=("int8",))
    assert [r["context"] for r in rows] == [0, 32768]
    assert rows[1]["bytes_total"] - rows[0]["bytes_total"] == 32768 * 12 * 2 * 2 * 256 * 2
    assert rows[0]["ceiling_tok_s"]["spark_datasheet"] > rows[1]["ceiling_tok_s"]["spark_datasheet"]


def test_a_config_without_the_moe_shape_is_refused_by_name() -> None:
    config = {k: v for k, v in TINY.items() if k != "moe_intermediate_size"}
    with pytest.raises(StepBytesError, match="moe_intermediate_size"):
        geometry(config)


def test_the_plan_reads_the_modelled_weights_where_the_checkpoint_is_not_here() -> None:
    from argparse import Namespace

    from sparkserve.plan.single import active_bytes
    from sparkserve.plan.step_bytes import weights_per_step

    config = json.loads(RECIPE.read_text())
    step = step_bytes(geometry(config), quantization(config), head="bf16")
    modelled = weights_per_step(config, "bf16")
    assert modelled == int(step.total - step.by_kind["gdn_state"])
    active, source = active_bytes(Namespace(active_gib=None), config, None, 67 * 2**30, "bf16")
    assert active == modelled and "bf16 head" in source and "step_bytes" in source
    # no quantization_config: a 16-bit count of an FP8 checkpoint would double it; no guess
    bare = {k: v for k, v in config.items() if k != "quantization_config"}
    assert weights_per_step(bare, "int8") is None
    assert active_bytes(Namespace(active_gib=None), bare, None, 1, "int8")[0] is None
