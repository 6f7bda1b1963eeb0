"""The dtypes the plan hands to vLLM (sparkserve.memory.dtypes): the architectures whose
config.json `mamba_ssm_dtype` counts are the ones vLLM's config hooks read it for, and the
launcher's flags are read as vLLM's parser reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkserve.memory.dtypes import READS_MAMBA_SSM_DTYPE, launcher_flags, resolve_dtypes

REPO = Path(__file__).resolve().parents[2]


def test_the_architectures_that_read_mamba_ssm_dtype_are_vllms() -> None:
    """vLLM's own map of per-architecture config hooks: the causal-LM and conditional-
    generation architectures whose hook is Qwen3.5's, and no Qwen3-Next hook."""
    from vllm.model_executor.models.config import (
        MODELS_CONFIG_MAP,
        Qwen3_5ForConditionalGenerationConfig,
    )

    reading = {
        arch
        for arch, hook in MODELS_CONFIG_MAP.items()
        if issubclass(hook, Qwen3_5ForConditionalGenerationConfig)
        and arch.endswith(("ForCausalLM", "ForConditionalGeneration"))
        and arch.startswith("Qwen3_5")
    }
    assert reading == READS_MAMBA_SSM_DTYPE
    assert "Qwen3NextForCausalLM" not in MODELS_CONFIG_MAP


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("", {}),
        ("--mamba-ssm-cache-dtype float32", {"mamba_ssm": "float32"}),
        ("--mamba-ssm-cache-dtype=bfloat16 --dtype half",
         {"mamba_ssm": "bfloat16", "model": "float16"}),
        ("--kv-cache-dtype fp8 --kv-cache-dtype auto", {}),
        ("--mamba-cache-dtype auto", {}),
    ],
)  # fmt: skip
def test_launcher_flags(extra: str, expected: dict[str, str]) -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    assert launcher_flags(extra) == expected
    # vLLM's parser takes the same words to the same fields
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = parser.parse_args(["--model", "m", *extra.split()])
    fields = {
        "model": "dtype", "kv_cache": "kv_cache_dtype", "mamba_conv": "mamba_cache_dtype",
        "mamba_ssm": "mamba_ssm_cache_dtype",
    }  # fmt: skip
    for name, field in fields.items():
        value = {"half": "float16"}.get(getattr(parsed, field), getattr(parsed, field))
        assert value == expected.get(name, "auto"), name


@pytest.mark.parametrize(
    "recipe", sorted(p.name for p in (REPO / "recipes").iterdir() if p.is_dir())
)
def test_every_recipe_states_its_gdn_state_dtype(recipe: str) -> None:
    """A shipped geometry never leaves the state dtype to the machine: the Qwen3.5 ones carry
    the checkpoint's field, the others get vLLM's "auto" rule, said so."""
    config = json.loads((REPO / "recipes" / recipe / "config.json").read_text())
    ssm = resolve_dtypes(config).mamba_ssm
    assert ssm is not None
    if set(config["architectures"]) & READS_MAMBA_SSM_DTYPE:
        assert (ssm.value, ssm.source) == ("float32", "config.json mamba_ssm_dtype")
    else:
        assert ssm.value == "bfloat16" and ssm.source.startswith("auto")
