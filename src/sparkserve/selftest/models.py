"""The selftest's models: a recipe's real geometry (or a tiny one), no weights, no download.

`write_models` writes a target and, where the geometry has one, a DFlash drafter as
config.json files that vLLM loads with `--load-format dummy` (random weights of the real
shapes), plus one tokenizer over the whole vocabulary. Fewer layers is the only change made to
a recipe's geometry: the head, attention and GatedDeltaNet shapes stay the recipe's, and the
drafter's target layers are scaled onto the layers kept.

The tokenizer is byte-level with no merges: every byte of a prompt is one token, so a prompt's
length in tokens is its length in bytes (the prefix-cache check builds prompts of whole
blocks), and every other id decodes to a word of its own (`w<id>`), so that whatever random
weights pick is text. Qwen's special and parser tokens come first, as single ids.
"""

from __future__ import annotations

import copy
import filecmp
import json
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sparkserve import recipes

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# single ids, as Qwen's own tokenizer has them: what the reasoning and tool parsers look for
PARSER_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n<tools>\\n' }}"
    "{%- for tool in tools -%}{{- tool | tojson }}{{- '\\n' }}{%- endfor -%}"
    "{{- '</tools><|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{- message['content'] }}{%- endif -%}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '\\n</think>\\n\\n' }}{%- endif -%}{%- endif -%}"
)

# The tiny hybrid the cpu image serves in CI: Qwen3.5's structure (GatedDeltaNet and
# attention layers, an MTP layer, an untied head, a DFlash drafter) at sizes a 2-core CPU
# starts in about a minute; head_dim 128 gives 128-token prefix-cache blocks on the CPU.
TINY_VOCAB = 4096
TINY_TARGET: dict[str, Any] = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
    "vocab_size": TINY_VOCAB, "hidden_size": 128, "intermediate_size": 256,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
    "attention_bias": False, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 1, "linear_num_value_heads": 1,
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 8192,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                        "partial_rotary_factor": 0.25},
    "partial_rotary_factor": 0.25, "tie_word_embeddings": False, "mtp_num_hidden_layers": 1,
    "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "bfloat16",
}  # fmt: skip
TINY_DRAFTER: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": TINY_VOCAB,
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
    "attention_bias": False, "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "max_position_embeddings": 8192, "rope_theta": 10000000, "tie_word_embeddings": False,
    "dflash_config": {"block_size": 16, "mask_token_id": TINY_VOCAB - 1,
                      "target_layer_ids": [1, 3]},
    "torch_dtype": "bfloat16",
}  # fmt: skip
TINY = "tiny"


class GeometryError(ValueError):
    """The geometry asked for cannot be built; the message is one line naming the value."""


@dataclass(frozen=True)
class Models:
    target: Path
    drafter: Path | None
    layers: int  # the target's, as written
    full_layers: int  # the geometry's own
    vocab: int
    max_len: int  # the target's max_position_embeddings


def geometry(name: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The target's and the drafter's config.json: TINY, or a recipe's files."""
    if name == TINY:
        return copy.deepcopy(TINY_TARGET), copy.deepcopy(TINY_DRAFTER)
    recipe = recipes.load(name)
    target = json.loads((recipe.geometry / "config.json").read_text())
    drafter_file = recipe.drafter_geometry / "config.json"
    drafter = json.loads(drafter_file.read_text()) if drafter_file.is_file() else None
    return target, drafter


def fewer_layers(
    target: dict[str, Any], drafter: dict[str, Any] | None, layers: int
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The same geometry with `layers` layers: the first `layers` layer types, the drafter's
    target layers scaled onto them (they must stay distinct)."""
    total = int(target["num_hidden_layers"])
    if not 1 <= layers <= total:
        raise GeometryError(f"--layers {layers}: must be from 1 to {total} for this geometry")
    target = {**target, "num_hidden_layers": layers}
    if "layer_types" in target:
        kept = target["layer_types"][:layers]
        if "full_attention" not in kept:
            interval = target.get("full_attention_interval", "?")
            raise GeometryError(
                f"--layers {layers}: keeps no attention layer (one in {interval}); use more"
            )
        target["layer_types"] = kept
    if drafter is None or "dflash_config" not in drafter:
        return target, drafter
    ids = drafter["dflash_config"]["target_layer_ids"]
    scaled = sorted({min(layers - 1, round(i * layers / total)) for i in ids})
    if len(scaled) != len(ids):
        raise GeometryError(
            f"--layers {layers}: the drafter reads {len(ids)} target layers; keep at least as many"
        )
    drafter = {**drafter, "dflash_config": {**drafter["dflash_config"], "target_layer_ids": scaled}}
    return target, drafter


def write_tokenizer(directory: Path, vocab: int) -> None:
    """Byte-level, no merges, one id per vocabulary entry (see the module docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    words = {text: i for i, text in enumerate((*SPECIAL_TOKENS, *PARSER_TOKENS))}
    words |= {char: len(words) + i for i, char in enumerate(alphabet)}
    words |= {f"w{i}": i for i in range(len(words), vocab)}
    if len(words) != vocab:
        raise GeometryError(f"vocab_size {vocab}: too small for the {len(words)} base tokens")
    tokenizer = Tokenizer(models.BPE(vocab=words, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in PARSER_TOKENS])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "add_bos_token": False, "model_max_length": 1 << 20, "chat_template": CHAT_TEMPLATE,
    }  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def configs(name: str, layers: int | None) -> tuple[dict[str, Any], dict[str, Any] | None, int]:
    """The geometry `name` (TINY or a recipe) with `layers` layers (all: None): the target's and
    the drafter's config.json, and the geometry's own layer count. GeometryError before any
    file is written."""
    target, drafter = geometry(name)
    full = int(target["num_hidden_layers"])
    return (*fewer_layers(target, drafter, layers or full), full)


def write_models(root: Path, name: str, layers: int | None) -> Models:
    """The geometry `name` (TINY or a recipe) under root/target and root/drafter."""
    return write_configs(root, *configs(name, layers))


def write_configs(
    root: Path, target: dict[str, Any], drafter: dict[str, Any] | None, full: int
) -> Models:
    target_dir = root / "target"
    target_dir.mkdir(parents=True, exist_ok=True)
    (target_dir / "config.json").write_text(json.dumps(target, indent=1))
    write_tokenizer(target_dir, int(target["vocab_size"]))
    drafter_dir = None
    if drafter is not None:
        drafter_dir = root / "drafter"
        drafter_dir.mkdir(parents=True, exist_ok=True)
        (drafter_dir / "config.json").write_text(json.dumps(drafter, indent=1))
    return Models(
        target=target_dir, drafter=drafter_dir, layers=int(target["num_hidden_layers"]),
        full_layers=full, vocab=int(target["vocab_size"]),
        max_len=int(target.get("max_position_embeddings", 0)),
    )  # fmt: skip


def models_home(hf_home: Path, name: str, layers: int | None) -> Path:
    """The one folder a geometry's models live in (under the model-cache volume): vLLM keys its
    compile cache on the model's path among the rest, so a later selftest of the same models
    reuses what an earlier one compiled instead of compiling and storing it again."""
    return hf_home / "sparkserve" / "selftest" / "models" / f"{name}-{layers or 'all'}-layers"


def same_files(one: Path, other: Path) -> bool:
    compared = filecmp.dircmp(one, other)
    if compared.left_only or compared.right_only or compared.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(one, other, compared.common_files, shallow=False)
    return (
        not mismatch
        and not errors
        and all(same_files(one / sub, other / sub) for sub in compared.common_dirs)
    )


def keep_models(home: Path, name: str, layers: int | None) -> Models:
    """`write_models` into `home`, whole or not at all: written beside it first, then left
    alone when `home` already holds the same files (a selftest may be serving them), else
    moved into its place."""
    written = configs(name, layers)  # refused before anything is written
    home.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{home.name}-", dir=home.parent))
    try:
        models = write_configs(fresh, *written)
        if home.is_dir() and same_files(fresh, home):
            shutil.rmtree(fresh)
        else:
            shutil.rmtree(home, ignore_errors=True)
            fresh.rename(home)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    drafter = home / models.drafter.name if models.drafter else None
    return replace(models, target=home / models.target.name, drafter=drafter)
