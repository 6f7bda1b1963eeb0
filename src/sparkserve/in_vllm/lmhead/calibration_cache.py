"""The lm-head calibration's result on the model-cache volume, so later starts skip measuring.

One file, ``$HF_HOME/sparkserve/lmhead-calibration.json``: ``{"key": {...}, "choice": {...}}``.
The key names everything the measurement depends on: the GPU (name, compute capability), its
driver, CUDA, Triton, torch, this package's version, the head's shape and dtype, and the rows
the server reaches. A file whose key differs (another GPU, an upgrade, another MAX_NUM_SEQS), or
that does not parse into a valid choice, is ignored; the new measurement replaces it (written to a
temporary file and renamed, so a reader never sees half a file).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from sparkserve.memory.checkpoint import hf_home

from . import layout
from .calibrate import BF16, Group, HeadChoice
from .int8_kernel import KernelConfig

__all__ = ["FILE_NAME", "SCHEMA", "cache_path", "driver_version", "key", "load", "store"]

FILE_NAME = "lmhead-calibration.json"
SCHEMA = 2  # bump when the file's form or the choice's meaning changes
KINDS = ("mmab", "gluon", "wgmma")


def cache_path(env: dict[str, str] | None = None) -> Path:
    """Where the file lives: under HF_HOME (the model-cache volume in the image)."""
    return hf_home(env) / "sparkserve" / FILE_NAME


def driver_version() -> str:
    """The NVIDIA kernel driver's version (``/proc/driver/nvidia/version``), else the CUDA driver
    API version torch reports, else "unknown"."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        for word in text.split():
            parts = word.split(".")
            if len(parts) >= 2 and all(p.isdigit() for p in parts):
                return word
    except OSError:
        pass
    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    try:
        return f"cuda-api-{get()}" if get is not None else "unknown"
    except Exception:  # no driver loaded
        return "unknown"


def key(weight: torch.Tensor, max_rows: int) -> dict[str, Any]:
    """The cache key of a head ``weight`` (on its device) for a server reaching ``max_rows``
    rows."""
    from sparkserve import __version__

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    if weight.is_cuda:
        props = torch.cuda.get_device_properties(weight.device)
        gpu, capability, driver = props.name, f"{props.major}.{props.minor}", driver_version()
    else:
        gpu, capability, driver = weight.device.type, "", ""
    return {
        "schema": SCHEMA,
        "gpu": gpu,
        "capability": capability,
        "driver": driver,
        "cuda": str(torch.version.cuda),
        "triton": triton_version,
        "torch": torch.__version__,
        "sparkserve": __version__,
        "shape": list(weight.shape),
        "dtype": str(weight.dtype),
        "max_rows": max_rows,
    }


def load(path: Path, expected: dict[str, Any]) -> tuple[HeadChoice | None, str]:
    """The cached choice for ``expected``, or (None, why not): missing, stale (another key) or
    corrupt."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, "no cache file"
    except OSError as error:
        return None, f"cache unreadable ({type(error).__name__})"
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("key"), dict):
            raise ValueError("no key")
        if data["key"] != expected:
            diff = sorted(k for k in expected.keys() | data["key"].keys()
                          if data["key"].get(k) != expected.get(k))  # fmt: skip
            return None, "stale cache (" + ", ".join(diff) + " differ)"
        return _choice_from(data["choice"]), "cache"
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        return None, f"corrupt cache ignored ({type(error).__name__}: {error})"


def store(path: Path, cache_key: dict[str, Any], choice: HeadChoice) -> str:
    """Write ``choice`` under ``cache_key``; returns "" or why it could not be written."""
    data = {"key": cache_key, "choice": _choice_to(choice)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".lmhead-", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1)
        os.replace(tmp, path)
    except OSError as error:
        return f"cache not written ({type(error).__name__}: {error})"
    return ""


def _choice_to(choice: HeadChoice) -> dict[str, Any]:
    out = dataclasses.asdict(choice)
    out["table"] = [[bound, dataclasses.asdict(cfg)] for bound, cfg in choice.table]
    return out


def _config(data: Any) -> KernelConfig:
    if not isinstance(data, dict):
        raise TypeError("a config is not an object")
    cfg = KernelConfig(**data)
    if cfg.kind not in KINDS:
        raise ValueError(f"unknown kernel kind {cfg.kind!r}")
    return cfg


def _choice_from(data: Any) -> HeadChoice:
    if not isinstance(data, dict):
        raise TypeError("the choice is not an object")
    if data["path"] not in ("int8", BF16) or data["layout"] not in layout.LAYOUTS:
        raise ValueError(f"path {data['path']!r} / layout {data['layout']!r}")
    table = tuple((int(bound), _config(cfg)) for bound, cfg in data["table"])
    bounds = [b for b, _ in table]
    if not table or bounds != sorted(set(bounds)):
        raise ValueError("table bounds are not increasing")
    if data["layout"] != layout.WGMMA and any(cfg.kind == "wgmma" for _, cfg in table):
        raise ValueError("a wgmma entry for a weight not in the wgmma layout")
    groups = tuple(
        Group(**{**g, "best": _config(g["best"]) if g.get("best") else None})
        for g in data["groups"]
    )
    return HeadChoice(
        path=data["path"],
        layout=data["layout"],
        table=table,
        groups=groups,
        max_rows=int(data["max_rows"]),
        seconds=float(data["seconds"]),
        source="cache",
        note=str(data.get("note", "")),
        layouts=tuple((str(a), float(b)) for a, b in data.get("layouts", ())),
    )
