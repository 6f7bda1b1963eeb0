"""memory/checkpoint.py: finding a model (a directory, or a Hugging Face id in the local cache
only), reading its config.json and its layer types, and counting its weights' bytes (all and
routed experts) from safetensors headers or the index. Bad input: a CheckpointError of one
line naming the path and the problem."""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from sparkserve.memory.checkpoint import (
    CheckpointError,
    Weights,
    cache_dir_name,
    find_snapshot,
    hf_home,
    layer_kinds,
    locate,
    read_config,
    text_config,
    weights,
)

HEADER_LIMIT = 100 * 1024 * 1024  # the largest safetensors header read
CONFIG = {"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 8}


def model_dir(path: Path, config: object = CONFIG) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def snapshot(home: Path, model_id: str, revision: str, *, mtime: float | None = None) -> Path:
    """A snapshot in the cache's layout, holding a config.json."""
    path = model_dir(home / "hub" / cache_dir_name(model_id) / "snapshots" / revision)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def checkpoint_error(call: Callable[..., object], *args: object) -> str:
    """The message of the CheckpointError `call(*args)` raises: one line."""
    with pytest.raises(CheckpointError) as error:
        call(*args)
    message = str(error.value)
    assert len(message.splitlines()) == 1, message
    return message


def test_hf_home_is_the_variable_else_the_users_cache() -> None:
    assert hf_home({"HF_HOME": "/data/hf"}) == Path("/data/hf")
    default = Path.home() / ".cache" / "huggingface"
    assert hf_home({}) == default
    assert hf_home({"HF_HOME": ""}) == default  # set but empty: the default


def test_cache_dir_name_follows_the_hub_layout() -> None:
    assert cache_dir_name("Qwen/Qwen3.5-122B-A10B") == "models--Qwen--Qwen3.5-122B-A10B"


def test_refs_main_wins_over_a_newer_snapshot(tmp_path: Path) -> None:
    main = snapshot(tmp_path, "org/model", "aaa", mtime=1_000)
    snapshot(tmp_path, "org/model", "bbb", mtime=2_000)
    refs = tmp_path / "hub" / cache_dir_name("org/model") / "refs"
    refs.mkdir()
    (refs / "main").write_text("aaa\n")
    assert find_snapshot("org/model", tmp_path) == main


def test_without_a_usable_ref_the_newest_snapshot_is_taken(tmp_path: Path) -> None:
    snapshot(tmp_path, "org/model", "old", mtime=1_000)
    newest = snapshot(tmp_path, "org/model", "new", mtime=3_000)
    snapshot(tmp_path, "org/model", "mid", mtime=2_000)
    assert find_snapshot("org/model", tmp_path) == newest
    # refs/main naming a snapshot that is not there: as if there were no ref
    refs = tmp_path / "hub" / cache_dir_name("org/model") / "refs"
    refs.mkdir()
    (refs / "main").write_text("gone")
    assert find_snapshot("org/model", tmp_path) == newest


def test_no_snapshot_is_none(tmp_path: Path) -> None:
    assert find_snapshot("org/model", tmp_path) is None  # not cached at all
    repo = tmp_path / "hub" / cache_dir_name("org/model")
    (repo / "snapshots").mkdir(parents=True)
    (repo / "snapshots" / "stray-file").write_text("")  # files are not snapshots
    assert find_snapshot("org/model", tmp_path) is None


def test_locate_a_directory_or_a_cached_id(tmp_path: Path) -> None:
    local = model_dir(tmp_path / "local")
    assert locate(str(local), tmp_path / "hf") == local
    cached = snapshot(tmp_path / "hf", "org/model", "abc")
    assert locate("org/model", tmp_path / "hf") == cached


def test_locate_errors_name_the_model_and_the_problem(tmp_path: Path) -> None:
    home = tmp_path / "hf"
    for missing in (str(tmp_path / "absent"), "./absent", "~/sparkserve-absent-model"):
        assert checkpoint_error(locate, missing, home) == f"{missing}: no such directory"
    message = checkpoint_error(locate, "org/absent", home)
    assert message.startswith(f"org/absent: not in the Hugging Face cache under {home / 'hub'} ")
    assert "nothing is downloaded" in message
    empty = tmp_path / "empty"
    empty.mkdir()
    assert checkpoint_error(locate, str(empty), home) == f"{empty}: no config.json in {empty}"
    # a cached snapshot without config.json names the id and the snapshot
    bare = snapshot(home, "org/bare", "abc")
    (bare / "config.json").unlink()
    assert checkpoint_error(locate, "org/bare", home) == f"org/bare: no config.json in {bare}"


def test_read_config_returns_the_object(tmp_path: Path) -> None:
    assert read_config(model_dir(tmp_path)) == CONFIG


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            '{"architectures": ["X"],',
            r"not valid JSON \(line 1, column 25: Expecting property name .*\)",
        ),
        ("[1, 2]", r"must hold a JSON object, not list"),
        ('{"hidden_size": 8}', r"no 'architectures' list; is this a model's config\.json\?"),
        ('{"architectures": []}', r"no 'architectures' list; .*"),
    ],
)
def test_read_config_errors(tmp_path: Path, content: str, expected: str) -> None:
    (tmp_path / "config.json").write_text(content)
    path = tmp_path / "config.json"
    message = checkpoint_error(read_config, tmp_path)
    assert message.startswith(f"{path}: "), message
    assert re.fullmatch(expected, message.removeprefix(f"{path}: ")), message


def test_read_config_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes(b"\xff\xfe{}")
    assert checkpoint_error(read_config, tmp_path) == (
        f"{tmp_path / 'config.json'}: not valid UTF-8 (invalid start byte)"
    )


def test_read_config_that_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "config.json").mkdir()  # a directory where the file should be
    assert (
        checkpoint_error(read_config, tmp_path)
        == f"{tmp_path / 'config.json'}: cannot read (Is a directory)"
    )


def test_text_config_is_the_inner_one_when_there_is_one() -> None:
    inner = {"hidden_size": 8}
    assert text_config({"architectures": ["X"], "text_config": inner}) is inner
    flat = {"architectures": ["X"], "hidden_size": 8}
    assert text_config(flat) is flat
    odd = {"architectures": ["X"], "text_config": "not a mapping"}
    assert text_config(odd) is odd


def test_layer_kinds_from_types_then_interval_then_all_full() -> None:
    types = ["linear_attention", "full_attention", "sliding_attention"]
    # layer_types wins over the count and the interval
    assert (
        layer_kinds({"layer_types": types, "num_hidden_layers": 9, "full_attention_interval": 4})
        == types
    )
    # every 4th layer (the 4th, 8th, ...) is full attention
    assert layer_kinds({"num_hidden_layers": 8, "full_attention_interval": 4}) == [
        *["linear_attention"] * 3, "full_attention", *["linear_attention"] * 3, "full_attention"
    ]  # fmt: skip
    assert (
        layer_kinds({"num_hidden_layers": 3, "full_attention_interval": 1})
        == ["full_attention"] * 3
    )
    for absent in ({}, {"full_attention_interval": None}, {"full_attention_interval": 0}):
        assert layer_kinds({"num_hidden_layers": 2, **absent}) == ["full_attention"] * 2
    # an empty layer_types list is no list
    assert layer_kinds({"layer_types": [], "num_hidden_layers": 1}) == ["full_attention"]


def write_tensors(path: Path, shapes: dict[str, tuple[int, ...]], dtype: str = "float32") -> int:
    """A safetensors file of zero tensors; returns their bytes."""
    tensors = {name: np.zeros(shape, dtype=dtype) for name, shape in shapes.items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
    return sum(t.nbytes for t in tensors.values())


def test_weights_sum_every_file_and_the_routed_experts(tmp_path: Path) -> None:
    first = write_tensors(
        tmp_path / "model-00001-of-00002.safetensors",
        {
            "model.embed_tokens.weight": (16, 8),
            "model.layers.0.mlp.experts.0.up_proj.weight": (4, 8),
            "model.layers.0.mlp.shared_expert.up_proj.weight": (4, 8),  # not a routed expert
        },
    )
    second = write_tensors(
        tmp_path / "model-00002-of-00002.safetensors",
        {"model.layers.1.mlp.experts.1.down_proj.weight": (8, 4), "lm_head.weight": (16, 8)},
        dtype="float16",
    )
    # the files' headers win over the index's total
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 1}}')
    found = weights(tmp_path)
    assert found == Weights(first + second, "2 safetensors file(s)", (4 * 8) * 4 + (8 * 4) * 2)


def test_weights_from_the_index_when_no_file_is_here(tmp_path: Path) -> None:
    assert weights(tmp_path) is None  # neither files nor index
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 12345}, "weight_map": {}}))
    found = weights(tmp_path)
    assert found == Weights(12345, "model.safetensors.index.json (files not downloaded yet)")
    assert found.expert_bytes is None  # unknown without the headers


def test_a_download_cut_short_is_sized_by_the_index(tmp_path: Path) -> None:
    # one of the index's two files here: its headers alone would undercount the checkpoint
    write_tensors(tmp_path / "model-00001-of-00002.safetensors", {"a.weight": (4, 8)})
    weight_map = {"a.weight": "model-00001-of-00002.safetensors",
                  "b.weight": "model-00002-of-00002.safetensors"}  # fmt: skip
    index = {"metadata": {"total_size": 999}, "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert weights(tmp_path) == Weights(999, "model.safetensors.index.json (1 of 2 files here)")
    write_tensors(tmp_path / "model-00002-of-00002.safetensors", {"b.weight": (2, 8)})
    assert weights(tmp_path) == Weights(4 * 8 * 4 + 2 * 8 * 4, "2 safetensors file(s)", 0)


@pytest.mark.parametrize(
    "index", [{"weight_map": {}}, {"metadata": {}}, {"metadata": {"total_size": "lots"}}, []]
)
def test_an_index_without_a_total_size(tmp_path: Path, index: object) -> None:
    path = tmp_path / "model.safetensors.index.json"
    path.write_text(json.dumps(index))
    assert checkpoint_error(weights, tmp_path) == f"{path}: no metadata.total_size"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x01\x02\x03", "shorter than 8 bytes"),
        (struct.pack("<Q", HEADER_LIMIT + 1), f"header of {HEADER_LIMIT + 1} bytes"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "bad header"),  # not UTF-8
        (struct.pack("<Q", 5) + b"{oops", "bad header"),  # not JSON
        (struct.pack("<Q", 2) + b"[]", "bad header"),  # not an object
        (struct.pack("<Q", 1000) + b"{}", "truncated header"),  # the file ends inside it
        (struct.pack("<Q", 31) + b'{"w": {"data_offsets": [0]}}   ', "bad data_offsets [0]"),
        (struct.pack("<Q", 32) + b'{"w": {"data_offsets": [8, 4]}}  ', "bad data_offsets [8, 4]"),
    ],
)
def test_a_file_that_is_not_safetensors(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    assert checkpoint_error(weights, tmp_path) == f"{path}: not a safetensors file ({problem})"
