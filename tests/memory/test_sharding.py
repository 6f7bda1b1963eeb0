"""memory/sharding.py: what each node of a pair holds of a checkpoint, from its config alone,
by vLLM's own rules (imported from vLLM on its CPU platform): the tp and pp splits of layers,
embedding and lm-head rows, the parts every tp rank holds in full, each node's bytes of a
checkpoint or of a decoded token's reads, and the drafter's share.

tests/plan/test_plan_pair.py checks these figures against the parameters vLLM's model class creates
on two real ranks for the 122B geometry (support/geometry.py); here the rules themselves, on
that geometry and on small variations of it.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparkserve.memory.checkpoint import CheckpointError
from sparkserve.memory.sharding import (
    Split,
    drafter_per_node,
    model_split,
    replicated_elements,
    resolved_text_config,
)
from support.geometry import LAYERS, VOCAB, drafter_config, target_config

HIDDEN = 3072  # the 122B's hidden size, bf16: one embedding row is 6144 bytes
ROW = HIDDEN * 2
FULL, LINEAR = LAYERS // 4, LAYERS - LAYERS // 4  # every fourth layer is full attention
GIB = 2**30


def target(**changes: Any) -> dict[str, Any]:
    """The 122B's text config with `changes` (None drops a key)."""
    config = {**target_config(), **changes}
    return {key: value for key, value in config.items() if value is not None}


def test_tp_splits_every_node_the_same() -> None:
    split = model_split(target(), "tp", 2)
    assert split.nodes == 2 and split.layout == "tp"
    assert split.layers == ((0, LAYERS), (0, LAYERS))  # every layer on both, each half
    assert split.vocab == split.padded_vocab == VOCAB  # 248320 is a multiple of 64
    assert split.embedding_rows == split.head_rows == (VOCAB // 2, VOCAB // 2)
    assert split.row_bytes == ROW and split.final_norm_bytes == ROW and not split.tied
    # per layer: two RMS norms, the router (256 experts), the shared-expert gate; q/k norms of
    # 256 on full-attention layers, GatedDeltaNet's gated norm of 128 on the others
    elements = LAYERS * (2 + 256 + 1) * HIDDEN + FULL * 2 * 256 + LINEAR * 128
    assert replicated_elements(target()) == elements
    assert split.replicated_bytes == 2 * elements


def test_pp_gives_each_stage_its_layers_and_the_last_the_head() -> None:
    split = model_split(target(), "pp", 2)
    assert split.layers == ((0, 24), (24, 48))
    assert split.embedding_rows == (VOCAB, VOCAB)  # built on every stage
    assert split.head_rows == (0, VOCAB)


def test_pp_stages_follow_vllms_partition_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's get_pp_indices decides the stages, its VLLM_PP_LAYER_PARTITION included."""
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "30,18")
    assert model_split(target(), "pp", 2).layers == ((0, 30), (30, 48))
    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION")
    odd = model_split(target(layer_types=None, num_hidden_layers=5), "pp", 2).layers
    assert odd[0][0] == 0 and odd[0][1] == odd[1][0] and odd[1][1] == 5
    assert {end - start for start, end in odd} == {2, 3}


def test_one_node_holds_everything() -> None:
    for layout in ("tp", "pp"):
        split = model_split(target(), layout, 1)
        assert split.layers == ((0, LAYERS),)
        assert split.embedding_rows == split.head_rows == (VOCAB,)
        assert split.per_node(100 * GIB) == (100 * GIB,)


def test_the_vocabulary_is_padded_to_64_rows() -> None:
    for vocab, padded in ((1000, 1024), (1024, 1024), (1025, 1088), (1, 64)):
        tp = model_split(target(vocab_size=vocab), "tp", 2)
        assert (tp.vocab, tp.padded_vocab) == (vocab, padded)
        assert tp.embedding_rows == tp.head_rows == (padded // 2, padded // 2)
        pp = model_split(target(vocab_size=vocab), "pp", 2)
        assert pp.embedding_rows == (padded, padded) and pp.head_rows == (0, padded)


def test_a_tied_head_is_the_embedding() -> None:
    untied, tied = (model_split(target(tie_word_embeddings=t), "tp", 2) for t in (False, True))
    assert tied.tied and tied.head_rows == (0, 0)  # each rank's head is its embedding rows
    assert tied.embedding_rows == untied.embedding_rows
    # one matrix fewer in the checkpoint
    assert untied.edge_bytes - tied.edge_bytes == VOCAB * ROW
    assert tied.edge_bytes == VOCAB * ROW + ROW


def test_a_tied_head_on_the_last_stage_is_its_embedding_copy() -> None:
    vocab = 1000  # padded to 1024
    split = model_split(target(vocab_size=vocab, tie_word_embeddings=True), "pp", 2)
    assert split.head_rows == (0, 0) and split.embedding_rows == (1024, 1024)
    whole = 60 * GIB + split.edge_bytes
    first, last = split.per_node(whole)
    assert first == 30 * GIB + 1024 * ROW
    assert last == 30 * GIB + 1024 * ROW + ROW  # the embedding, serving as the head too
    # a decoded token reads the first stage's embedding and the last stage's, as its head
    assert split.per_node(whole, reads=True) == (first, last)


@pytest.mark.parametrize("nodes", [0, -1])
def test_a_split_needs_a_node(nodes: int) -> None:
    with pytest.raises(ValueError, match=rf"^nodes {nodes}: must be 1 or more$"):
        model_split(target(), "tp", nodes)


def test_a_drafter_sharing_the_targets_embedding_holds_none() -> None:
    split = model_split(drafter_config(), "tp", 2, embeds=False)
    assert split.vocab == split.padded_vocab == 0
    assert split.embedding_rows == split.head_rows == (0, 0)
    assert split.edge_bytes == split.final_norm_bytes == ROW  # only its final norm
    assert split.layers == ((0, 6), (0, 6))
    # a dense drafter: two norms per layer and q/k norms of its head_dim 128, no router
    assert split.replicated_bytes == 2 * 6 * (2 * HIDDEN + 2 * 128)


@pytest.mark.parametrize(
    ("dtype", "row_bytes"),
    [
        ({"torch_dtype": "float32"}, 4 * HIDDEN),
        ({"torch_dtype": "torch.float16"}, 2 * HIDDEN),
        ({"torch_dtype": None}, 2 * HIDDEN),  # none stated: bf16
        ({"torch_dtype": "float8_e4m3fn"}, 2 * HIDDEN),  # unknown: counted as bf16
        ({"dtype": "float32", "torch_dtype": "bfloat16"}, 4 * HIDDEN),  # dtype wins
    ],
)
def test_rows_are_counted_in_the_configs_dtype(dtype: dict[str, Any], row_bytes: int) -> None:
    split = model_split(target(**dtype), "tp", 2)
    assert split.row_bytes == split.final_norm_bytes == row_bytes
    assert split.replicated_bytes == replicated_elements(target()) * row_bytes // HIDDEN


def test_replicated_parts_of_other_models() -> None:
    # no head_dim: hidden // heads (3072 // 32 = 96) for the q/k norms
    no_head_dim = replicated_elements(target(head_dim=None))
    assert replicated_elements(target()) - no_head_dim == FULL * 2 * (256 - 96)
    # routed experts without a shared expert: no shared-expert gate
    no_shared = replicated_elements(target(shared_expert_intermediate_size=None))
    assert replicated_elements(target()) - no_shared == LAYERS * HIDDEN
    # a dense model: no router, no gate
    dense = replicated_elements(target(num_experts=None, shared_expert_intermediate_size=None))
    assert no_shared - dense == LAYERS * 256 * HIDDEN
    # layer types by the interval: the same mix as the explicit list
    assert replicated_elements(target(layer_types=None)) == replicated_elements(target())
    # no linear_value_head_dim: GatedDeltaNet's layers add nothing beyond their two norms
    assert (
        replicated_elements(target()) - replicated_elements(target(linear_value_head_dim=None))
        == LINEAR * 128
    )


@pytest.mark.parametrize("tied", [False, True])
def test_tp_nodes_hold_the_checkpoint_plus_the_replicated_copy(tied: bool) -> None:
    """Over both ranks: the whole checkpoint, once more each part every rank holds in full,
    and the padding rows; each rank the same."""
    vocab = 1000  # padded to 1024
    split = model_split(target(vocab_size=vocab, tie_word_embeddings=tied), "tp", 2)
    matrices = 1 if tied else 2
    whole = 60 * GIB + split.edge_bytes + split.replicated_bytes  # an even body
    nodes = split.per_node(whole)
    assert nodes[0] == nodes[1]
    extra = split.replicated_bytes + split.final_norm_bytes + (1024 - vocab) * matrices * ROW
    assert sum(nodes) == whole + extra
    assert nodes[0] == 30 * GIB + 512 * matrices * ROW + split.replicated_bytes + ROW


def test_pp_nodes_hold_their_layers_and_the_later_stage_an_embedding_copy() -> None:
    vocab = 1000  # padded to 1024
    split = model_split(target(vocab_size=vocab), "pp", 2)
    whole = 60 * GIB + split.edge_bytes
    first, last = split.per_node(whole)
    assert first == 30 * GIB + 1024 * ROW  # half the layers and the embedding
    assert last == 30 * GIB + 2 * 1024 * ROW + ROW  # the rest, embedding, head, final norm
    # a decoded token reads the embedding on the first stage only
    assert split.per_node(whole, reads=True) == (first, last - 1024 * ROW)


@pytest.mark.parametrize("layout", ["tp", "pp"])
def test_a_checkpoint_smaller_than_its_edges_leaves_no_body(layout: str) -> None:
    split = model_split(target(), layout, 2)
    edges_only = split.per_node(0)
    assert edges_only == split.per_node(split.edge_bytes // 2)  # body never negative
    if layout == "tp":
        assert edges_only == (VOCAB * ROW + split.replicated_bytes + ROW,) * 2
    else:
        assert edges_only == (VOCAB * ROW, 2 * VOCAB * ROW + ROW)


def test_drafter_per_node() -> None:
    tp = model_split(drafter_config(), "tp", 2, embeds=False)
    pp = model_split(drafter_config(), "pp", 2, embeds=False)
    assert drafter_per_node(tp, 0) == drafter_per_node(pp, 0) == (0, 0)  # no drafter
    whole = 2 * GIB + tp.replicated_bytes + ROW
    # tp: halved like the target, each rank with the replicated parts and the final norm
    assert drafter_per_node(tp, whole) == (GIB + tp.replicated_bytes + ROW,) * 2
    # pp: whole on the last stage, where vLLM builds it
    assert drafter_per_node(pp, whole) == (0, whole)


def test_a_bad_layout_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"^layout 'ring': must be one of tp, pp$"):
        model_split(target(), "ring", 2)


@pytest.mark.parametrize(
    ("hidden", "call"),
    [
        ("vllm.distributed.utils", lambda _: model_split(target(), "tp", 2)),
        ("transformers", resolved_text_config),
    ],
)
def test_without_vllm_or_transformers_an_import_error(
    hidden: str, call: Callable[[Path], object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(target()))
    monkeypatch.setitem(sys.modules, hidden, None)  # importing it fails, as when not installed
    with pytest.raises(ImportError):
        call(tmp_path)


def test_resolved_config_fills_transformers_defaults(tmp_path: Path) -> None:
    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps(target(num_experts=None)))
    resolved = resolved_text_config(tmp_path)
    default = AutoConfig.for_model("qwen3_5_moe_text").num_experts
    assert default and resolved["num_experts"] == default
    assert resolved["hidden_size"] == HIDDEN  # what the file states is kept
    # the router of the defaulted expert count is counted
    assert replicated_elements(resolved) - replicated_elements(target(num_experts=None)) == (
        LAYERS * (default + 1) * HIDDEN
    )


def test_resolved_config_is_the_text_models(tmp_path: Path) -> None:
    text = {key: value for key, value in target().items() if key != "architectures"}
    wrapper = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
    }
    (tmp_path / "config.json").write_text(json.dumps(wrapper))
    resolved = resolved_text_config(tmp_path)
    assert resolved["model_type"] == "qwen3_5_moe_text"
    assert model_split(resolved, "tp", 2) == model_split(target(), "tp", 2)


@pytest.mark.parametrize(
    "config", [{"architectures": ["X"], "model_type": "no-such-type"}, None]
)  # a model type transformers does not know; no config.json at all
def test_a_config_transformers_cannot_read(tmp_path: Path, config: dict[str, Any] | None) -> None:
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        resolved_text_config(tmp_path)
    message = str(error.value)
    assert "\n" not in message
    assert re.fullmatch(
        rf"{re.escape(str(tmp_path))}: transformers cannot read its config\.json \(\w+: .+\)",
        message,
    ), message


def test_pp_shares_the_body_by_layer_count() -> None:
    split = Split(
        layout="pp", layers=((0, 1), (1, 4)), embedding_rows=(8, 8), head_rows=(0, 8), hidden=2,
        row_bytes=4, replicated_bytes=0, final_norm_bytes=4, vocab=8, padded_vocab=8, tied=False,
    )  # fmt: skip
    # layers 1 and 3 of a body of 400 bytes; embedding 32 bytes; head and norm on the last
    whole = 400 + split.edge_bytes
    assert split.per_node(whole) == (100 + 32, 300 + 32 + 32 + 4)
