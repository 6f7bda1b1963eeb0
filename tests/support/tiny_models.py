"""Build a tiny Qwen3.5 hybrid target, a tiny plain Qwen3 target, a tiny DFlash drafter and a
tokenizer, offline.

Everything is deterministic (fixed seeds, generated text) and written into a directory
that is reused when its recorded content key still matches, so a test pays the build
cost (a few seconds) once. Needs torch, numpy, safetensors and tokenizers: all present
in the CPU serving venv, so the usual way to call this is

    $SPARKSERVE_CPU_PYTHON tests/support/tiny_models.py OUT_DIR

which prints a JSON object with the targets' and the drafter's paths.

Geometry (see shared FACTS): hidden 128, 4 layers [linear, full, linear, full],
4 query / 2 KV heads of 128 (head_dim 128 gives 128-token prefix-cache blocks on the
CPU), GatedDeltaNet with one 128-wide key/value head, untied lm_head and one MTP layer.
The plain target (Qwen3ForCausalLM, the cpu image default's architecture) has the same sizes
with two full-attention layers and no recurrent state.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

VOCAB_SIZE = 4096
HIDDEN = 128
INTERMEDIATE = 256
HEAD_DIM = 128
NUM_HEADS = 4
NUM_KV_HEADS = 2
LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
SEED = 20261130
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MASK_TOKEN = "<|dflash_mask|>"  # the last id, used as DFlash's mask_token_id
# What vLLM's qwen3 reasoning parser and qwen3_xml tool parser look for, added as Qwen's own
# tokenizer adds them (single ids, kept in decoded text).
PARSER_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
STAMP = ".sparkserve-tiny.json"

CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n<tools>\\n' }}"
    "{%- for tool in tools -%}{{- tool | tojson }}{{- '\\n' }}{%- endfor -%}"
    "{{- '</tools><|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{- message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def target_config() -> dict[str, Any]:
    """config.json of the tiny hybrid target (Qwen3_5ForCausalLM, qwen3_5_text)."""
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": len(LAYER_TYPES),
        "layer_types": LAYER_TYPES,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "attention_bias": False,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
        },
        "partial_rotary_factor": 0.25,
        "tie_word_embeddings": False,
        "mtp_num_hidden_layers": 1,
        "bos_token_id": None,
        "eos_token_id": 2,  # <|im_end|>
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }


# The hybrid target's fields that only its linear-attention layers and MTP head read.
_HYBRID_ONLY = ("layer_types", "mtp_num_hidden_layers", "rope_parameters", "partial_rotary_factor")


def plain_config() -> dict[str, Any]:
    """config.json of the tiny plain target (Qwen3ForCausalLM: attention layers only), the
    hybrid target's sizes otherwise."""
    config = {
        k: v
        for k, v in target_config().items()
        if k not in _HYBRID_ONLY and not k.startswith("linear_")
    }
    config |= {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_hidden_layers": 2,
        "rope_theta": 1000000,
        # room for test 8b's stream that outlasts the drain (the hybrid target keeps 8192)
        "max_position_embeddings": 32768,
    }
    return config


def drafter_config() -> dict[str, Any]:
    """config.json of the tiny DFlash drafter: shares the target's embeddings and head."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": 1,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "attention_bias": False,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192,
        "rope_theta": 10000000,
        "tie_word_embeddings": False,
        "block_size": 16,
        "dflash_config": {"mask_token_id": VOCAB_SIZE - 1, "target_layer_ids": [1, 3]},
        "torch_dtype": "bfloat16",
    }


# ---------------------------------------------------------------- weights


def _linear(out_f: int, in_f: int) -> tuple[tuple[int, ...], str]:
    return (out_f, in_f), "linear"


def _decoder_attention(prefix: str) -> dict[str, tuple[tuple[int, ...], str]]:
    q = NUM_HEADS * HEAD_DIM
    kv = NUM_KV_HEADS * HEAD_DIM
    return {
        # Qwen3.5 attention has an output gate: q_proj emits query and gate.
        f"{prefix}.self_attn.q_proj.weight": _linear(2 * q, HIDDEN),
        f"{prefix}.self_attn.k_proj.weight": _linear(kv, HIDDEN),
        f"{prefix}.self_attn.v_proj.weight": _linear(kv, HIDDEN),
        f"{prefix}.self_attn.o_proj.weight": _linear(HIDDEN, q),
        f"{prefix}.self_attn.q_norm.weight": ((HEAD_DIM,), "norm0"),
        f"{prefix}.self_attn.k_norm.weight": ((HEAD_DIM,), "norm0"),
    }


def _decoder_common(prefix: str, norm: str) -> dict[str, tuple[tuple[int, ...], str]]:
    return {
        f"{prefix}.mlp.gate_proj.weight": _linear(INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.up_proj.weight": _linear(INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.down_proj.weight": _linear(HIDDEN, INTERMEDIATE),
        f"{prefix}.input_layernorm.weight": ((HIDDEN,), norm),
        f"{prefix}.post_attention_layernorm.weight": ((HIDDEN,), norm),
    }


def target_tensor_specs() -> dict[str, tuple[tuple[int, ...], str]]:
    """Checkpoint name -> (shape, init kind) for the target, MTP layer included."""
    key_dim = value_dim = 128  # one linear-attention head of 128
    conv_dim = 2 * key_dim + value_dim
    specs: dict[str, tuple[tuple[int, ...], str]] = {
        "model.embed_tokens.weight": ((VOCAB_SIZE, HIDDEN), "embed"),
        "model.norm.weight": ((HIDDEN,), "norm0"),
        "lm_head.weight": _linear(VOCAB_SIZE, HIDDEN),
    }
    for i, kind in enumerate(LAYER_TYPES):
        p = f"model.layers.{i}"
        if kind == "linear_attention":
            specs |= {
                f"{p}.linear_attn.in_proj_qkv.weight": _linear(conv_dim, HIDDEN),
                f"{p}.linear_attn.in_proj_z.weight": _linear(value_dim, HIDDEN),
                f"{p}.linear_attn.in_proj_b.weight": _linear(1, HIDDEN),
                f"{p}.linear_attn.in_proj_a.weight": _linear(1, HIDDEN),
                f"{p}.linear_attn.conv1d.weight": ((conv_dim, 1, 4), "conv"),
                f"{p}.linear_attn.dt_bias": ((1,), "ones"),
                f"{p}.linear_attn.A_log": ((1,), "a_log"),
                f"{p}.linear_attn.norm.weight": ((value_dim,), "ones"),
                f"{p}.linear_attn.out_proj.weight": _linear(HIDDEN, value_dim),
            }
        else:
            specs |= _decoder_attention(p)
        specs |= _decoder_common(p, "norm0")
    # Multi-token-prediction head (vLLM's Qwen3_5MTP reads the mtp.* tensors).
    specs |= {
        "mtp.fc.weight": _linear(HIDDEN, 2 * HIDDEN),
        "mtp.norm.weight": ((HIDDEN,), "norm0"),
        "mtp.pre_fc_norm_hidden.weight": ((HIDDEN,), "norm0"),
        "mtp.pre_fc_norm_embedding.weight": ((HIDDEN,), "norm0"),
    }
    specs |= _decoder_attention("mtp.layers.0")
    specs |= _decoder_common("mtp.layers.0", "norm0")
    return specs


def plain_tensor_specs() -> dict[str, tuple[tuple[int, ...], str]]:
    """Checkpoint names of the plain Qwen3 target (no attention output gate, plain RMSNorm)."""
    q = NUM_HEADS * HEAD_DIM
    kv = NUM_KV_HEADS * HEAD_DIM
    specs: dict[str, tuple[tuple[int, ...], str]] = {
        "model.embed_tokens.weight": ((VOCAB_SIZE, HIDDEN), "embed"),
        "model.norm.weight": ((HIDDEN,), "ones"),
        "lm_head.weight": _linear(VOCAB_SIZE, HIDDEN),
    }
    for i in range(plain_config()["num_hidden_layers"]):
        p = f"model.layers.{i}"
        specs |= {
            f"{p}.self_attn.q_proj.weight": _linear(q, HIDDEN),
            f"{p}.self_attn.k_proj.weight": _linear(kv, HIDDEN),
            f"{p}.self_attn.v_proj.weight": _linear(kv, HIDDEN),
            f"{p}.self_attn.o_proj.weight": _linear(HIDDEN, q),
            f"{p}.self_attn.q_norm.weight": ((HEAD_DIM,), "ones"),
            f"{p}.self_attn.k_norm.weight": ((HEAD_DIM,), "ones"),
        }
        specs |= _decoder_common(p, "ones")
    return specs


def drafter_tensor_specs() -> dict[str, tuple[tuple[int, ...], str]]:
    """Checkpoint names of a z-lab style DFlash drafter (no embeddings, no lm_head)."""
    n_ctx = len(drafter_config()["dflash_config"]["target_layer_ids"])
    specs: dict[str, tuple[tuple[int, ...], str]] = {
        "fc.weight": _linear(HIDDEN, n_ctx * HIDDEN),
        "hidden_norm.weight": ((HIDDEN,), "ones"),
        "norm.weight": ((HIDDEN,), "ones"),
    }
    q = NUM_HEADS * HEAD_DIM
    kv = NUM_KV_HEADS * HEAD_DIM
    specs |= {
        "layers.0.self_attn.q_proj.weight": _linear(q, HIDDEN),
        "layers.0.self_attn.k_proj.weight": _linear(kv, HIDDEN),
        "layers.0.self_attn.v_proj.weight": _linear(kv, HIDDEN),
        "layers.0.self_attn.o_proj.weight": _linear(HIDDEN, q),
        "layers.0.self_attn.q_norm.weight": ((HEAD_DIM,), "ones"),
        "layers.0.self_attn.k_norm.weight": ((HEAD_DIM,), "ones"),
    }
    specs |= _decoder_common("layers.0", "ones")
    return specs


def _random_tensors(specs: dict[str, tuple[tuple[int, ...], str]], seed: int) -> dict[str, Any]:
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for name in sorted(specs):
        shape, kind = specs[name]
        if kind == "linear":
            arr = rng.standard_normal(shape) / np.sqrt(shape[1])
        elif kind == "embed":
            arr = rng.standard_normal(shape)
        elif kind == "conv":
            arr = rng.standard_normal(shape) / 2.0
        elif kind == "a_log":
            arr = np.log(rng.uniform(1.0, 16.0, shape))
        elif kind == "ones":
            arr = np.ones(shape)
        else:  # "norm0": Gemma-style RMSNorm scales by (1 + weight)
            arr = 0.1 * rng.standard_normal(shape)
        tensor = torch.from_numpy(arr.astype(np.float32))
        # A_log and dt_bias stay float32 like the real checkpoints.
        keep_fp32 = name.endswith(("A_log", "dt_bias"))
        out[name] = tensor if keep_fp32 else tensor.to(torch.bfloat16)
    return out


# ---------------------------------------------------------------- tokenizer


_WORD_TEXT = (
    "the of and to in is it that for on with as was at by be this are from or have an "
    "they which one you had not but what all were when we there can been has more if no "
    "model server cache prefix token block memory request stream decode draft target "
    "layer weight tensor kernel batch queue launch health metric spark window context "
    "fast slow small large first last next every other same long short time value state"
)
_WORDS = _WORD_TEXT.split()
_CODE = [
    "def {f}({a}, {b}):\n    return {a} + {b}\n",
    "for {a} in range({n}):\n    total += {a} * {n}\n",
    "if {a} > {n}:\n    {b} = {f}({a})\nelse:\n    {b} = None\n",
    "class {F}:\n    def __init__(self, {a}):\n        self.{a} = {a}\n",
    "{b} = [{f}(x) for x in {a} if x % {n} == 0]\n",
    "import {f}\nfrom {f}.{a} import {F}\n",
    '{a} = {{"{b}": {n}, "{f}": "{F}"}}\n',
]


def corpus(lines: int = 3000, seed: int = SEED) -> Iterator[str]:
    """Deterministic English-like and Python-like training text."""
    rng = random.Random(seed)
    names = ["x", "y", "n", "item", "value", "count", "size", "block", "token", "cache"]
    for i in range(lines):
        if i % 3 == 2:
            template = rng.choice(_CODE)
            yield template.format(
                f=rng.choice(names) + "_" + rng.choice(names),
                F=rng.choice(names).capitalize() + "Spec",
                a=rng.choice(names),
                b=rng.choice(names),
                n=rng.randint(0, 999),
            )
        else:
            words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 18))]
            words[0] = words[0].capitalize()
            yield " ".join(words) + rng.choice([".", ".", "?", "!", ","]) + "\n"


def build_tokenizer(out_dir: Path) -> None:
    """Train a byte-level BPE of exactly VOCAB_SIZE ids (specials first, mask last)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 1 - len(PARSER_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(text, special=False, normalized=False) for text in PARSER_TOKENS])
    # A small corpus may stop short of the target size: pad with reserved tokens so that
    # the tokenizer covers every id the model can emit.
    filler = [f"<|reserved_{i}|>" for i in range(VOCAB_SIZE - 1 - tok.get_vocab_size())]
    tok.add_special_tokens([*filler, MASK_TOKEN])
    if tok.get_vocab_size() != VOCAB_SIZE or tok.token_to_id(MASK_TOKEN) != VOCAB_SIZE - 1:
        raise RuntimeError("tokenizer size does not match the model vocabulary")
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": 8192,
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "add_bos_token": False,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )


# ---------------------------------------------------------------- build + cache


def _content_key(kind: str) -> str:
    h = hashlib.sha256()
    h.update(kind.encode())
    h.update(Path(__file__).read_bytes())  # any change to this recipe rebuilds
    return h.hexdigest()


def _cached(out_dir: Path, key: str) -> bool:
    stamp = out_dir / STAMP
    try:
        return json.loads(stamp.read_text())["key"] == key
    except (OSError, ValueError, KeyError):
        return False


def _write_atomically(out_dir: Path, key: str, fill: Any) -> Path:
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fill(tmp)
    (tmp / STAMP).write_text(json.dumps({"key": key}))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def build_tiny_target(out_dir: str | Path, kind: str = "target") -> Path:
    """A target with real random bf16 weights (model.safetensors) and the tokenizer: the
    hybrid one ("target") or the plain one ("plain")."""
    out = Path(out_dir)
    key = _content_key(kind)
    if _cached(out, key):
        return out
    config, specs = (
        (target_config(), target_tensor_specs)
        if kind == "target"
        else (plain_config(), plain_tensor_specs)
    )

    def fill(d: Path) -> None:
        from safetensors.torch import save_file

        (d / "config.json").write_text(json.dumps(config, indent=2))
        (d / "generation_config.json").write_text(
            json.dumps({"eos_token_id": 2, "pad_token_id": 0, "do_sample": False})
        )
        save_file(
            _random_tensors(specs(), SEED),
            str(d / "model.safetensors"),
            metadata={"format": "pt"},
        )
        build_tokenizer(d)

    out.parent.mkdir(parents=True, exist_ok=True)
    return _write_atomically(out, key, fill)


def build_tiny_dflash(out_dir: str | Path, *, with_weights: bool = True) -> Path:
    """DFlash drafter: config.json, plus random weights unless ``with_weights`` is
    False (then serve it with ``"draft_load_config": {"load_format": "dummy"}``)."""
    out = Path(out_dir)
    key = _content_key(f"dflash-{with_weights}")
    if _cached(out, key):
        return out

    def fill(d: Path) -> None:
        (d / "config.json").write_text(json.dumps(drafter_config(), indent=2))
        if with_weights:
            from safetensors.torch import save_file

            save_file(
                _random_tensors(drafter_tensor_specs(), SEED + 1),
                str(d / "model.safetensors"),
                metadata={"format": "pt"},
            )

    out.parent.mkdir(parents=True, exist_ok=True)
    return _write_atomically(out, key, fill)


def build_all(root: str | Path) -> dict[str, str]:
    base = Path(root)
    return {
        "target": str(build_tiny_target(base / "qwen35-tiny")),
        "plain": str(build_tiny_target(base / "qwen3-tiny-plain", "plain")),
        "dflash": str(build_tiny_dflash(base / "qwen35-tiny-dflash")),
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_models.py OUT_DIR")
    print(json.dumps(build_all(sys.argv[1])))
