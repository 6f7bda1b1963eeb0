"""The int8 lm-head plugin: its decisions on real vLLM head classes (on a real server:
tests/e2e/test_lmhead_vs_bf16.py)."""

from __future__ import annotations

import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sparkserve.in_vllm.lmhead import plugin
from sparkserve.in_vllm.lmhead.int8_kernel import dequantize_rows_int8

VOCAB, HIDDEN = 4096, 128


def vllm_head_method() -> object:
    method = pytest.importorskip("vllm.model_executor.layers.vocab_parallel_embedding")
    return method.UnquantizedEmbeddingMethod()


def make_model(*, tied: bool = False, bias: bool = False) -> torch.nn.Module:
    """A model shaped like vLLM's: `lm_head` with a weight and vLLM's unquantised method."""
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.config = SimpleNamespace(tie_word_embeddings=tied)
    head = torch.nn.Module()
    head.weight = torch.nn.Parameter(
        (torch.randn(VOCAB, HIDDEN) * 0.02).to(torch.bfloat16), requires_grad=False
    )
    head.bias = torch.nn.Parameter(torch.randn(VOCAB).to(torch.bfloat16)) if bias else None
    head.quant_method = vllm_head_method()
    head.quant_method.process_weights_after_loading(head)  # as vLLM's loader does
    model.lm_head = head
    return model


def head_logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    head = model.lm_head
    return head.quant_method.apply(head, x, bias=head.bias)


def test_convert_quantises_frees_the_bf16_weight_and_keeps_the_logits() -> None:
    model = make_model(bias=True)
    x = torch.randn(13, HIDDEN).to(torch.bfloat16)
    before = head_logits(model, x).float()
    bf16 = weakref.ref(model.lm_head.weight.data)
    report = plugin.convert_model(model)
    assert report.path == "int8" and report.bf16_released and bf16() is None
    assert report.freed_bytes == VOCAB * HIDDEN * 2
    assert report.int8_bytes == VOCAB * HIDDEN + VOCAB * 4
    head = model.lm_head
    assert head.int8_weight.dtype == torch.int8 and head.weight.numel() == 0
    after = head_logits(model, x)
    assert after.dtype == torch.bfloat16 and after.shape == (13, VOCAB)
    # against a float64 product of the dequantised weights: bf16 output rounding only
    reference = (
        x.double() @ dequantize_rows_int8(head.int8_weight, head.int8_scale).double().T
        + head.bias.double()
    )
    assert (after.double() - reference).norm() / reference.norm() < 1e-2
    # against the bf16 head: int8 rounding of weights, well under a logit's scale
    assert (after.float() - before).abs().max() < 0.05 * before.abs().max()
    assert plugin.convert_model(model).reason == "already converted"


def test_convert_stores_the_layout_it_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the GPU wants the wgmma layout (forced here on the CPU), the head keeps the packed
    weight and its layout, and the logits do not change."""
    from sparkserve.in_vllm.lmhead import layout

    monkeypatch.setattr(plugin, "preferred_layout", lambda device: layout.WGMMA)
    model = make_model(bias=True)
    x = torch.randn(5, HIDDEN).to(torch.bfloat16)
    before = head_logits(model, x).float()
    report = plugin.convert_model(model)
    head = model.lm_head
    assert report.layout == head.int8_layout == layout.WGMMA
    assert head.int8_weight.shape == (layout.packed_rows(VOCAB, layout.WGMMA), HIDDEN)
    assert report.int8_bytes == head.int8_weight.numel() + VOCAB * 4
    q = layout.unpack(head.int8_weight, VOCAB, layout.WGMMA)
    reference = (
        x.double() @ dequantize_rows_int8(q, head.int8_scale).double().T + head.bias.double()
    )
    after = head_logits(model, x)
    assert (after.double() - reference).norm() / reference.norm() < 1e-2
    assert (after.float() - before).abs().max() < 0.05 * before.abs().max()


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("keep", "SPARK_KEEP_BF16_LMHEAD=1"),
        ("tied", "tied to the input embedding"),
        ("quantised", "already quantised"),
        ("no-head", "no lm_head"),
        ("pipeline-stage", "this pipeline stage holds no lm_head"),
    ],
)
def test_heads_it_must_not_touch_stay_bf16(
    setup: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_model(tied=setup == "tied")
    if setup == "keep":
        monkeypatch.setenv(plugin.KEEP_ENV, "1")
    if setup == "quantised":
        model.lm_head.quant_method = SimpleNamespace()  # any other method: a quantised head
    if setup == "no-head":
        del model.lm_head
        model.lm_head = None
    if setup == "pipeline-stage":  # an early stage of a pipeline-parallel model
        utils = pytest.importorskip("vllm.model_executor.models.utils")
        del model.lm_head
        model.lm_head = utils.PPMissingLayer()
    weight = None if setup in ("no-head", "pipeline-stage") else model.lm_head.weight
    report = plugin.convert_model(model)
    assert report.path == "bf16" and reason in report.reason
    if weight is not None:
        assert model.lm_head.weight is weight and weight.numel() == VOCAB * HIDDEN


def test_drafter_sharing_the_head_gets_int8_and_one_with_its_own_is_left_alone() -> None:
    target, own = make_model(), make_model()
    shared = torch.nn.Module()
    shared.lm_head = target.lm_head
    assert "shares" in plugin.convert_model(target, shared).drafter
    assert isinstance(shared.lm_head.quant_method, plugin.Int8HeadMethod)

    other = make_model()
    report = plugin.convert_model(other, own)
    assert report.drafter == "has its own head (left alone)"
    assert own.lm_head.weight.numel() == VOCAB * HIDDEN
    assert not isinstance(own.lm_head.quant_method, plugin.Int8HeadMethod)


# vLLM 0.33's runners and where each keeps a drafter: (runner module, speculator class under
# SPECULATORS, or None for the V1 runner's plain `drafter` attribute).
SPECULATORS = "vllm.v1.worker.gpu.spec_decode"
# The drafters that share the target's head (DFlash, MTP) in the V2 runner's speculators.
SHARING_SPECULATORS = ("dflash.speculator.DFlashSpeculator", "mtp.speculator.MTPSpeculator")


def runners_with_their_own_load_model() -> set[type]:
    """vLLM's model runners found by what they are: every class in the release's worker
    modules named for a model runner that defines load_model itself."""
    import importlib
    import inspect
    import pkgutil

    worker = importlib.import_module("vllm.v1.worker")
    found = set()
    for info in pkgutil.walk_packages(worker.__path__, "vllm.v1.worker."):
        if "model_runner" not in info.name.rsplit(".", 1)[-1]:
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and value.__module__ == module.__name__
                and "load_model" in vars(value)
            ):
                found.add(value)
    return found


@pytest.mark.release
def test_the_plugin_wraps_every_runner_of_this_release() -> None:
    """Whatever the release calls its runners and wherever it keeps them (0.34 dropped
    gpu_model_runner and moved the CPU runner), each one with a load_model of its own is
    wrapped, and wrapping twice changes nothing."""
    runners = runners_with_their_own_load_model()
    assert any(r.__name__ == "GPUModelRunner" for r in runners), runners
    wrapped = plugin.register()
    assert plugin.register() == wrapped
    for runner in runners:
        name = f"{runner.__module__}.{runner.__qualname__}"
        assert getattr(runner.load_model, plugin._WRAPPED, False), f"{name} is not wrapped"
        assert runner in wrapped or any(issubclass(runner, w) for w in wrapped), name
        assert not getattr(runner.load_model.__wrapped__, plugin._WRAPPED, False), name


def test_a_vllm_without_any_known_runner_is_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(plugin, "RUNNERS", (("vllm.v1.worker.no_such_runner", "Runner"),))
    with caplog.at_level("WARNING", logger=plugin.logger.name):
        assert plugin.register() == []
    assert "none of the model runners it knows" in caplog.text, caplog.text
    assert "vllm.v1.worker.no_such_runner.Runner" in caplog.text


def gpu_runner_classes() -> list[type]:
    """The release's runners of the GPU family (its GPUModelRunner classes)."""
    return sorted(
        (r for r in runners_with_their_own_load_model() if r.__name__ == "GPUModelRunner"),
        key=lambda r: r.__module__,
    )


@pytest.mark.release
@pytest.mark.parametrize("speculator", SHARING_SPECULATORS)
def test_the_drafter_sharing_the_head_is_found_in_each_runner(speculator: str) -> None:
    """The report names a drafter that shares the head whichever of the release's GPU runners
    loaded it (vLLM's own classes, built without a GPU: only the attributes the lookup reads
    are set): the V2 runner keeps it in its speculator, the V1 runner (to 0.33) at drafter."""
    import importlib

    module, _, name = f"{SPECULATORS}.{speculator}".rpartition(".")
    speculator_class = getattr(importlib.import_module(module), name)
    classes = gpu_runner_classes()
    assert classes
    for runner_class in classes:
        runner = object.__new__(runner_class)
        target, drafter = make_model(), torch.nn.Module()
        drafter.lm_head = target.lm_head
        if runner_class.__module__.endswith("gpu.model_runner"):
            runner.speculator = object.__new__(speculator_class)
            runner.speculator.model = drafter
        else:
            runner.drafter = SimpleNamespace(model=drafter)
        runner.model = target
        report = plugin.convert_runner(runner)
        assert report.path == "int8", (runner_class.__module__, report)
        assert "shares" in report.drafter, (runner_class.__module__, report)
        assert isinstance(drafter.lm_head.quant_method, plugin.Int8HeadMethod)


def test_runner_accounting_and_failure_never_stops_load(tmp_path: Path) -> None:
    class Runner:
        def __init__(self, model: torch.nn.Module | None) -> None:
            self.model_memory_usage = 10_000_000
            self._model = model

        def load_model(self) -> str:
            return "loaded"

        def get_model(self) -> torch.nn.Module:
            if self._model is None:
                raise RuntimeError("boom")
            return self._model

    wrapped = plugin._wrap_load_model(Runner.load_model)
    runner = Runner(make_model())
    assert wrapped(runner) == "loaded"
    net = VOCAB * HIDDEN * 2 - (VOCAB * HIDDEN + VOCAB * 4)
    assert runner.model_memory_usage == 10_000_000 - net
    broken = Runner(None)
    assert wrapped(broken) == "loaded"  # the error is logged, the server goes on
    assert broken.model_memory_usage == 10_000_000
