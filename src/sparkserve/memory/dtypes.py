"""The dtypes a plan assumes, decided from its inputs alone (config.json and the vLLM flags the
launcher passes), never left to the machine the plan runs on.

The launchers pass no dtype flag (EXTRA_ARGS may), so vLLM's "auto" decides on a Spark. vLLM
0.33 (0.32 alike) decides so:

- model: config.json's dtype (`get_torch_dtype`, transformers_utils/model_arch_config_convertor.py)
  if the platform supports it; float32 becomes the platform's first dtype
  (`_resolve_auto_dtype`, config/model.py): bfloat16 on CUDA capability 8.0+ (a Spark's GB10
  is 12.1) and on x86/aarch64 Linux CPUs.
- KV cache: "auto" is the model dtype.
- GatedDeltaNet/Mamba conv state: --mamba-cache-dtype, "auto" the model dtype; SSM (temporal)
  state: --mamba-ssm-cache-dtype, "auto" the conv state's dtype
  (`MambaStateDtypeCalculator._mamba_state_dtype`, model_executor/layers/mamba/mamba_utils.py)
  except where a model's config hook sets it first: the Qwen3.5 family's takes config.json's
  `mamba_ssm_dtype` (`Qwen3_5ForConditionalGenerationConfig.verify_and_update_config`,
  model_executor/models/config.py). Qwen3.5 checkpoints publish "float32"; without the field
  the state is bfloat16 and the attention block of the 122B geometry is 1216, not 2240.

The plan hands every one of these to vLLM explicitly, so a transformers config class default
or the platform vLLM detects cannot change its figures.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from sparkserve.memory.checkpoint import layer_kinds, text_config

# The architectures whose vLLM config hook reads config.json's `mamba_ssm_dtype` (vLLM 0.33
# MODELS_CONFIG_MAP: Qwen3_5ForConditionalGenerationConfig and Qwen3_5ForCausalLMConfig).
# Qwen3-Next has no such hook: vLLM ignores the field there.
READS_MAMBA_SSM_DTYPE = frozenset(
    {
        "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
    }
)
# vLLM's flag for each dtype; "auto" (its default) means "not given".
FLAGS = {
    "model": "--dtype",
    "kv_cache": "--kv-cache-dtype",
    "mamba_conv": "--mamba-cache-dtype",
    "mamba_ssm": "--mamba-ssm-cache-dtype",
}
_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}
FALLBACK_MODEL_DTYPE = "bfloat16"  # the first dtype of CUDA 8.0+ and Linux CPU platforms


@dataclass(frozen=True)
class Choice:
    value: str
    source: str  # why: the flag, config.json's field, or vLLM's rule for "auto"


@dataclass(frozen=True)
class Dtypes:
    """What the plan passes to vLLM; the Mamba ones are None for a model without them."""

    model: Choice
    kv_cache: Choice
    mamba_conv: Choice | None
    mamba_ssm: Choice | None

    def engine_args(self) -> dict[str, str]:
        """EngineArgs fields. The model and SSM state dtypes are always explicit; the KV cache
        and conv state stay "auto" unless a flag names them ("auto" is the explicit model
        dtype, and a backend may refuse an explicit KV dtype it would take as "auto")."""
        args = {"dtype": self.model.value, "kv_cache_dtype": _flag_or_auto(self.kv_cache)}
        if self.mamba_conv is not None and self.mamba_ssm is not None:
            args["mamba_cache_dtype"] = _flag_or_auto(self.mamba_conv)
            args["mamba_ssm_cache_dtype"] = self.mamba_ssm.value
        return args

    def describe(self) -> str:
        parts = [("model", self.model), ("KV cache", self.kv_cache)]
        parts += [("GDN conv", self.mamba_conv), ("GDN SSM", self.mamba_ssm)]
        return "; ".join(f"{name} {c.value} ({c.source})" for name, c in parts if c is not None)


def _flag_or_auto(choice: Choice) -> str:
    return "auto" if choice.source.startswith("auto") else choice.value


def _normal(value: str) -> str:
    return _ALIASES.get(value, value)


def launcher_flags(extra_args: str) -> dict[str, str]:
    """The dtype flags among the launcher's EXTRA_ARGS (the launchers pass none of their own),
    by dtype name; the last one given wins, as in vLLM's parser."""
    words = shlex.split(extra_args)
    found: dict[str, str] = {}
    for name, flag in FLAGS.items():
        for index, word in enumerate(words):
            if word.startswith(flag + "="):
                found[name] = word.split("=", 1)[1]
            elif word == flag and index + 1 < len(words):
                found[name] = words[index + 1]
    return {name: _normal(value) for name, value in found.items() if value != "auto"}


def _config_dtype(config: dict[str, Any]) -> str | None:
    for where in (config, text_config(config)):
        for key in ("dtype", "torch_dtype"):
            if isinstance(where.get(key), str):
                return _normal(where[key])
    return None


def _hybrid(text: dict[str, Any]) -> bool:
    if not (text.get("layer_types") or "num_hidden_layers" in text):
        return False
    return "linear_attention" in layer_kinds(text)


def resolve_dtypes(config: dict[str, Any], flags: dict[str, str] | None = None) -> Dtypes:
    """The dtypes vLLM on a Spark would use for this config.json and these flags."""
    flags = flags or {}
    given = "given (EXTRA_ARGS {})"
    if "model" in flags:
        model = Choice(flags["model"], given.format(FLAGS["model"]))
    else:
        found = _config_dtype(config)
        if found in ("bfloat16", "float16"):
            model = Choice(found, "config.json")
        else:
            why = "config.json says float32" if found else "config.json names none"
            model = Choice(FALLBACK_MODEL_DTYPE, f"{why}: vLLM's first dtype on a Spark")
    kv_cache = (
        Choice(flags["kv_cache"], given.format(FLAGS["kv_cache"]))
        if "kv_cache" in flags
        else Choice(model.value, "auto: the model dtype")
    )
    text = text_config(config)
    if not _hybrid(text):
        return Dtypes(model, kv_cache, None, None)
    conv = (
        Choice(flags["mamba_conv"], given.format(FLAGS["mamba_conv"]))
        if "mamba_conv" in flags
        else Choice(model.value, "auto: the model dtype")
    )
    published = text.get("mamba_ssm_dtype", config.get("mamba_ssm_dtype"))
    architectures = set(config.get("architectures") or ())
    if "mamba_ssm" in flags:
        ssm = Choice(flags["mamba_ssm"], given.format(FLAGS["mamba_ssm"]))
    elif isinstance(published, str) and architectures & READS_MAMBA_SSM_DTYPE:
        ssm = Choice(_normal(published), "config.json mamba_ssm_dtype")
    else:
        silent = "config.json silent" if published is None else "vLLM ignores it for this model"
        ssm = Choice(conv.value, f"auto, {silent}: the conv state's dtype")
    return Dtypes(model, kv_cache, conv, ssm)
