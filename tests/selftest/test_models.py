"""The selftest's models: the recipe's geometry kept, only the layers fewer; a tokenizer that
vLLM's own loader (transformers) reads, one token per byte, every id decodable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.recipes import load
from sparkserve.selftest.models import (
    PARSER_TOKENS,
    TINY,
    GeometryError,
    fewer_layers,
    geometry,
    keep_models,
    models_home,
    write_models,
)

SPARK = "qwen3.5-122b-a10b"
SHAPES = ("vocab_size", "hidden_size", "num_key_value_heads", "head_dim", "linear_num_key_heads",
          "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
          "mamba_ssm_dtype", "tie_word_embeddings", "num_experts", "num_experts_per_tok",
          "moe_intermediate_size", "shared_expert_intermediate_size",
          "quantization_config")  # fmt: skip


def test_a_recipe_geometry_keeps_every_shape_and_only_loses_layers(tmp_path: Path) -> None:
    models = write_models(tmp_path, SPARK, 8)
    written = json.loads((models.target / "config.json").read_text())
    recipe = json.loads((load(SPARK).geometry / "config.json").read_text())
    assert {k: written.get(k) for k in SHAPES} == {k: recipe.get(k) for k in SHAPES}
    assert written["num_hidden_layers"] == 8 and models.full_layers == 48
    assert written["layer_types"] == recipe["layer_types"][:8]
    assert "full_attention" in written["layer_types"]
    drafter = json.loads((models.drafter / "config.json").read_text())  # type: ignore[operator]
    ids = drafter["dflash_config"]["target_layer_ids"]
    assert ids == sorted(set(ids)) and len(ids) == 8 and max(ids) < 8
    assert drafter["hidden_size"] == written["hidden_size"]


@pytest.mark.parametrize(
    ("layers", "says"),
    [(0, "--layers 0: must be from 1 to 48"), (49, "--layers 49: must be from 1 to 48"),
     (3, "keeps no attention layer"), (4, "the drafter reads 8 target layers")],
)  # fmt: skip
def test_layers_that_break_the_geometry_are_refused_by_name(layers: int, says: str) -> None:
    target, drafter = geometry(SPARK)
    with pytest.raises(GeometryError, match=says):
        fewer_layers(target, drafter, layers)


def test_the_tokenizer_gives_one_token_per_byte_and_decodes_every_id(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    models = write_models(tmp_path, TINY, None)
    tokenizer = AutoTokenizer.from_pretrained(str(models.target))
    assert len(tokenizer) == models.vocab == 4096
    text = 'abc defg, {"unit": "kelvin"}\n'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text.encode()) and tokenizer.decode(ids) == text
    for token in PARSER_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1
    assert tokenizer.decode([models.vocab - 1]) == f"w{models.vocab - 1}"
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|im_start|>assistant\n<think>\n")


def test_a_geometry_keeps_one_folder_written_once_and_mended_when_it_differs(
    tmp_path: Path,
) -> None:
    """vLLM's compile cache is keyed on the model's path: every run of the same geometry must
    serve the same folder, left as it is when it already holds the right files."""
    home = models_home(tmp_path, SPARK, 8)
    assert home == models_home(tmp_path, SPARK, 8) != models_home(tmp_path, SPARK, 12)
    assert models_home(tmp_path, TINY, None) != home
    first = keep_models(home, SPARK, 8)
    assert first.target == home / "target" and first.drafter == home / "drafter"
    config = home / "target" / "config.json"
    written, inode = config.read_text(), config.stat().st_ino
    assert keep_models(home, SPARK, 8) == first
    assert config.stat().st_ino == inode  # not written again: a running selftest may read it
    config.write_text("{}")  # a folder an older version wrote, or a broken one
    keep_models(home, SPARK, 8)
    assert config.read_text() == written
    assert sorted(p.name for p in home.parent.iterdir()) == [home.name]  # nothing left beside


def test_a_refused_geometry_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(GeometryError, match="--layers 3: keeps no attention layer"):
        keep_models(models_home(tmp_path, SPARK, 3), SPARK, 3)
    assert list(tmp_path.iterdir()) == []


def run_selftest(hf_home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkserve", "selftest", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HOME": str(hf_home)})  # fmt: skip


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--cases", "plain,nope"], "--cases: 'nope' is not one of plain, dflash, mtp, bf16"),
     (["--recipe", "nope"], "RECIPE='nope': no such recipe; one of "),
     (["--recipe", SPARK, "--layers", "3"], "--layers 3: keeps no attention layer")],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2_before_any_start(
    args: list[str], says: str, tmp_path: Path
) -> None:
    done = run_selftest(tmp_path, *args)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert done.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing written
