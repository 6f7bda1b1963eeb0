"""config.json files with the real geometry of the shipped models, for config-only checks.

No weights: vLLM builds its engine configuration from config.json alone (`--load-format
dummy` or no load at all). Numbers from ../shared/FACTS.md; the MoE shape as the shipped recipe
has it, with its sources (recipes/qwen3.5-122b-a10b.toml); it changes neither the KV nor the
speculative config.
"""

from __future__ import annotations

import json
from pathlib import Path

LAYERS = 48
FULL_ATTENTION_EVERY = 4
VOCAB = 248320
# Tokens a chat, tool or reasoning parser looks up in the vocabulary.
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "<function", "</function>", "<parameter", "</parameter>",
)  # fmt: skip


def target_config() -> dict:
    layer_types = [
        "full_attention"
        if i % FULL_ATTENTION_EVERY == FULL_ATTENTION_EVERY - 1
        else "linear_attention"
        for i in range(LAYERS)
    ]
    return {
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe_text",
        "hidden_size": 3072,
        "num_hidden_layers": LAYERS,
        "layer_types": layer_types,
        "full_attention_interval": FULL_ATTENTION_EVERY,
        "num_attention_heads": 32,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 64,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        # Qwen3.5 checkpoints publish their GatedDeltaNet state dtype; vLLM reads it
        # (docs/MEMORY.md, "The dtypes"). Without it the state is bf16 and the geometry not a
        # Spark's: attention block 1216 instead of the logged 2240.
        "mamba_ssm_dtype": "float32",
        # 256 routed experts, 8 per token, plus a shared expert (the recipe's sources)
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 1024,
        "shared_expert_intermediate_size": 1024,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "partial_rotary_factor": 0.25,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000,
            "partial_rotary_factor": 0.25,
        },
        "torch_dtype": "bfloat16",
        "mtp_num_hidden_layers": 1,
    }


def drafter_config() -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": 3072,
        "num_hidden_layers": 6,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 9216,
        "vocab_size": VOCAB,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10_000_000,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "dflash_config": {
            "block_size": 16,
            "mask_token_id": 248077,
            "target_layer_ids": [1, 7, 14, 20, 26, 32, 39, 45],
        },
    }


def write_word_tokenizer(directory: Path) -> None:
    """A word-level tokenizer holding the special tokens; enough for the parsers to start."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [*SPECIAL_TOKENS, "[UNK]", *(chr(c) for c in range(ord("a"), ord("z") + 1))]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": "[UNK]",
                "model_max_length": 262144,
            }
        )
    )


def write_geometry_models(root: Path) -> tuple[Path, Path]:
    """Write target/ and drafter/ under root; return their paths."""
    target, drafter = root / "target", root / "drafter"
    for directory, config in ((target, target_config()), (drafter, drafter_config())):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(config, indent=1))
    write_word_tokenizer(target)
    return target, drafter
