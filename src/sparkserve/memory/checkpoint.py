"""A checkpoint on disk: where it is, its config.json, and how many bytes its weights take.

A model is a local directory or a Hugging Face id looked up in the local cache only
(`$HF_HOME/hub/models--ORG--NAME/snapshots/REV`); nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A model cannot be read; the message is one line naming the path and the problem."""


def hf_home(env: dict[str, str] | None = None) -> Path:
    """The model cache: HF_HOME where set (the images set the registry's default), else
    huggingface_hub's own default, as on a host. Every tool and the lm-head's calibration
    cache find it here."""
    env = dict(os.environ) if env is None else env
    return Path(env.get("HF_HOME") or Path.home() / ".cache" / "huggingface")


def cache_dir_name(model_id: str) -> str:
    return "models--" + model_id.replace("/", "--")


def find_snapshot(model_id: str, home: Path) -> Path | None:
    """The cached snapshot of `model_id` (refs/main first, else the newest), or None."""
    repo = home / "hub" / cache_dir_name(model_id)
    ref = repo / "refs" / "main"
    if ref.is_file():
        snapshot = repo / "snapshots" / ref.read_text().strip()
        if snapshot.is_dir():
            return snapshot
    snapshots = sorted(
        (p for p in (repo / "snapshots").glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime
    )
    return snapshots[-1] if snapshots else None


def locate(model: str, home: Path) -> Path:
    """A directory holding the model's config.json; CheckpointError when there is none."""
    path = Path(model).expanduser()
    if path.is_dir():
        directory = path
    elif model.startswith(("/", ".", "~")):
        raise CheckpointError(f"{model}: no such directory")
    else:
        snapshot = find_snapshot(model, home)
        if snapshot is None:
            raise CheckpointError(
                f"{model}: not in the Hugging Face cache under {home / 'hub'} (nothing is "
                "downloaded here); pass a local directory or fetch its config.json first"
            )
        directory = snapshot
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"{model}: no config.json in {directory}")
    return directory


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(
            f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
        ) from None
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{path}: not valid UTF-8 ({error.reason})") from None
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read ({error.strerror})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: must hold a JSON object, not {type(config).__name__}")
    if not config.get("architectures"):
        raise CheckpointError(f"{path}: no 'architectures' list; is this a model's config.json?")
    return config


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def layer_kinds(text: dict[str, Any]) -> list[str]:
    """Each decoder layer's type ("full_attention", "linear_attention", ...): `layer_types`,
    else every `full_attention_interval`-th layer full attention, else all of them."""
    kinds = text.get("layer_types")
    if kinds:
        return [str(kind) for kind in kinds]
    count = int(text["num_hidden_layers"])
    every = text.get("full_attention_interval")
    if not every:
        return ["full_attention"] * count
    return [
        "full_attention" if (i + 1) % int(every) == 0 else "linear_attention" for i in range(count)
    ]


@dataclass(frozen=True)
class Weights:
    bytes: int
    source: str  # how the size was found
    expert_bytes: int | None = None  # routed experts (tensor names with ".experts.")


def _safetensors_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise CheckpointError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (length,) = struct.unpack("<Q", head)
        if length > 100 * 1024 * 1024:
            raise CheckpointError(f"{path}: not a safetensors file (header of {length} bytes)")
        text = handle.read(length)
        if len(text) != length:
            raise CheckpointError(f"{path}: not a safetensors file (truncated header)")
        try:
            header = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CheckpointError(f"{path}: not a safetensors file (bad header)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file (bad header)")
    return header


def safetensors_length(path: Path) -> int:
    """The bytes a whole safetensors file takes by its own header: the 8-byte length, the
    header, and the data up to the end of its last tensor. A file of another size was cut
    short (or is not what its header says); CheckpointError when the header cannot be read."""
    header = _safetensors_header(path)
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
    end = 0
    for name, info in header.items():
        if name != "__metadata__" and isinstance(info, dict):
            offsets = info.get("data_offsets", (0, 0))
            _tensor_bytes(path, info)  # rejects malformed offsets
            end = max(end, int(offsets[1]))
    return 8 + length + end


def _tensor_bytes(path: Path, info: dict[str, Any]) -> int:
    """A header entry's size from its data_offsets, [start, end] in bytes."""
    offsets = info.get("data_offsets", (0, 0))
    if (
        not isinstance(offsets, (list, tuple))
        or len(offsets) != 2
        or not all(isinstance(x, int) and x >= 0 for x in offsets)
        or offsets[1] < offsets[0]
    ):
        raise CheckpointError(f"{path}: not a safetensors file (bad data_offsets {offsets!r})")
    return int(offsets[1]) - int(offsets[0])


INDEX = "model.safetensors.index.json"


def weights_index(directory: Path) -> tuple[int, set[str]] | None:
    """The index's total_size and the files its weight_map names; None without an index."""
    index = directory / INDEX
    if not index.is_file():
        return None
    try:
        data = json.loads(index.read_text())
        size = int(data["metadata"]["total_size"])
        names = {str(name) for name in data.get("weight_map", {}).values()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(f"{index}: no metadata.total_size") from None
    return size, names


def weights(directory: Path) -> Weights | None:
    """Bytes of the checkpoint's tensors: from the safetensors headers when all its files are
    here, else the index's total_size (a download not started or cut short); None when
    neither is present."""
    files = sorted(directory.glob("*.safetensors"))
    index = weights_index(directory)
    missing = index[1] - {path.name for path in files} if index is not None else set()
    if files and not missing:
        total = experts = 0
        for path in files:
            for name, info in _safetensors_header(path).items():
                if name == "__metadata__" or not isinstance(info, dict):
                    continue
                size = _tensor_bytes(path, info)
                total += size
                if ".experts." in name:
                    experts += size
        return Weights(total, f"{len(files)} safetensors file(s)", experts)
    if index is not None:
        have = len(index[1]) - len(missing)
        where = "files not downloaded yet" if not files else f"{have} of {len(index[1])} files here"
        return Weights(index[0], f"{INDEX} ({where})")
    return None


# Layer kinds of attention layers: a model whose layers are all of these keeps no recurrent
# (Mamba-style) state, so vLLM's Mamba cache settings do not apply to it.
ATTENTION_KINDS = frozenset(
    {"full_attention", "sliding_attention", "chunked_attention", "attention"}
)


def is_hybrid(config: dict[str, Any]) -> bool:
    """Whether the model mixes attention with recurrent-state layers (GatedDeltaNet's
    linear attention, Mamba): from `layer_types` / `full_attention_interval` (Qwen3.5,
    Qwen3-Next), `layers_block_type` (Jamba) or `hybrid_override_pattern` (Nemotron-H, "M" for
    a Mamba layer)."""
    text = text_config(config)
    if "layer_types" in text or "full_attention_interval" in text:
        return any(kind not in ATTENTION_KINDS for kind in layer_kinds(text))
    blocks = text.get("layers_block_type")
    if isinstance(blocks, list):
        return any(str(kind) not in ATTENTION_KINDS for kind in blocks)
    return "M" in str(text.get("hybrid_override_pattern", ""))
