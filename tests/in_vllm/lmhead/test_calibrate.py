"""The int8 lm-head's calibration: which groups it times, what it keeps, its budget, its cache on
the model-cache volume, the SPARK_LMHEAD_CALIBRATE knob and the plugin's log line. On the CPU the
kernels take the torch path, so the choices come from timers the tests set; on a CUDA GPU the
same calls run the real kernels under CUDA events."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from sparkserve.in_vllm.lmhead import calibrate, calibration_cache, int8_kernel, layout, plugin
from sparkserve.in_vllm.lmhead.calibrate import BF16, HeadChoice
from sparkserve.in_vllm.lmhead.int8_kernel import CONFIG_TABLE, WGMMA_TABLE, KernelConfig
from sparkserve.launch.settings import resolve_settings
from sparkserve.launch.vllm_command import vllm_command

N, K = 1024, 128
BAD = KernelConfig("mmab", 64, 64, 64, 4, 2)


def _head(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    w = (torch.randn(N, K) * 0.02).to(torch.bfloat16)
    q, s = int8_kernel.quantize_rows_int8(w)
    return w, q, s


def _bf16(w: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: torch.nn.functional.linear(x, w)


BAD_TABLE = ((16, BAD), *CONFIG_TABLE[1:])


def _rows_choice(times: Callable[[int, Any], float], max_rows: int, **kwargs: Any) -> HeadChoice:
    """Calibrate a fresh CPU head in the rows layout with timings from ``times``."""
    w, q, s = _head()
    return calibrate.calibrate(
        {layout.ROWS: q}, s, _bf16(w), max_rows=max_rows, timer=table_timer(times), **kwargs
    )


def table_timer(times: Callable[[int, Any], float]) -> calibrate.Timer:
    """A timer whose milliseconds come from ``times(m, choice)`` (the choice logic under test);
    it still runs every call once, as the real timer does."""

    def timer(m: int, calls: Mapping[Any, Callable[[], Any]]) -> dict[Any, float]:
        for call in calls.values():
            call()
        return {choice: times(m, choice) for choice in calls}

    return timer


def wall_timer(m: int, calls: Mapping[Any, Callable[[], Any]]) -> dict[Any, float]:
    """Host wall-clock milliseconds per call (the CPU's torch path and bf16 GEMM)."""
    out = {}
    for choice, call in calls.items():
        t0 = time.perf_counter()
        for _ in range(3):
            call()
        out[choice] = (time.perf_counter() - t0) / 3 * 1e3
    return out


# --- what is timed --------------------------------------------------------------------------


def test_groups_are_the_dispatch_groups_the_server_reaches() -> None:
    assert calibrate.groups(CONFIG_TABLE, 39) == [(16, 16), (32, 32), (40, 39)]
    assert calibrate.groups(WGMMA_TABLE, 39) == [(16, 16), (32, 32), (40, 39)]
    assert calibrate.groups(CONFIG_TABLE, 64) == [(16, 16), (32, 32), (40, 40), (48, 48),
                                                  (1 << 62, 64)]  # fmt: skip
    assert calibrate.groups(CONFIG_TABLE, 1) == [(16, 1)]
    assert calibrate.groups(CONFIG_TABLE, 16) == [(16, 16)]
    # past the last bound: the open group, timed at no more than MAX_TIMED_ROWS rows
    open_group = calibrate.groups(CONFIG_TABLE, 3 * 257)[-1]
    assert open_group == (1 << 62, calibrate.MAX_TIMED_ROWS)


def test_candidates_start_with_the_table_entry_and_fit_the_layout() -> None:
    rows = calibrate.candidates(26, layout.ROWS, CONFIG_TABLE)
    assert rows[0] == int8_kernel.select_config(26)
    assert len(rows) == len(set(rows))
    assert all(c.kind in ("mmab", "gluon") for c in rows)
    assert int8_kernel.fewer_stages(rows[0]) in rows  # a shallower pipeline is a candidate
    assert all(c.kind == "mmab" for c in calibrate.candidates(100, layout.ROWS, CONFIG_TABLE))
    tiled = calibrate.candidates(39, layout.WGMMA, WGMMA_TABLE)
    assert tiled[0].kind == "wgmma"
    assert all(c.kind == "wgmma" or c.block_n == layout.TILE_ROWS for c in tiled)


# --- what is kept ---------------------------------------------------------------------------


def test_a_bad_table_entry_is_replaced_by_the_fastest_candidate() -> None:
    good = int8_kernel.select_config(1)

    def times(m: int, choice: Any) -> float:
        if choice == BF16:
            return 1.0
        return {BAD: 3.0, good: 0.4}.get(choice, 0.6)

    choice = _rows_choice(times, 13, tables={layout.ROWS: BAD_TABLE})
    assert choice.path == "int8" and choice.source == "measured"
    (group,) = choice.groups
    assert (group.m, group.table_ms, group.best_ms, group.best) == (13, 3.0, 0.4, good)
    assert choice.table[0] == (16, good) and choice.table[1:] == CONFIG_TABLE[1:]
    line = choice.summary()
    assert "M<=13 0.400 ms mmab 16x128x256 s3 (table 3.000) vs bf16 1.000, 2.50x" in line


def test_bf16_stays_where_int8_loses_in_any_reached_group() -> None:
    def times(m: int, choice: Any) -> float:
        if choice == BF16:
            return 1.0
        return 1.3 if m == 32 else 0.5  # every int8 candidate loses at 17-32 rows

    choice = _rows_choice(times, 39)
    assert choice.path == BF16
    assert "int8 (1.300 ms) is slower than bf16 (1.000 ms) at M=32" in choice.summary()
    # the same GPU with a server that never reaches 17 rows keeps int8
    assert _rows_choice(times, 12).path == "int8"


def test_a_wrong_candidate_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """A configuration whose output differs from the bf16 head's is dropped before timing."""
    real = int8_kernel.int8_linear

    def broken_for_bad(*args: Any, config: Any = None, **kwargs: Any) -> torch.Tensor:
        out = real(*args, config=config, **kwargs)
        if config == BAD:
            out.mul_(-1.0)  # a kernel that computes the wrong thing
        return out

    monkeypatch.setattr(calibrate, "int8_linear", broken_for_bad)
    timed: list[Any] = []

    def times(m: int, choice: Any) -> float:
        timed.append(choice)
        return {BF16: 1.0, BAD: 0.1}.get(choice, 0.5)

    choice = _rows_choice(times, 8, tables={layout.ROWS: BAD_TABLE})
    assert BAD not in timed and choice.groups[0].table_ms is None
    assert choice.path == "int8" and choice.table[0][1] != BAD
    assert "(table failed)" in choice.summary()


def test_the_layout_whose_best_times_sum_lowest_is_kept() -> None:
    w, q, s = _head()
    tiled = layout.pack(q, layout.WGMMA)

    def times(m: int, choice: Any) -> float:
        if choice == BF16:
            return 1.0
        return 0.3 if choice.kind == "wgmma" else 0.5

    choice = calibrate.calibrate(
        {layout.WGMMA: tiled, layout.ROWS: q}, s, _bf16(w), max_rows=39, timer=table_timer(times)
    )
    assert choice.layout == layout.WGMMA and all(c.kind == "wgmma" for _, c in choice.table[:3])
    assert "wgmma layout (sum of best ms: wgmma 0.900, rows 1.500)" in choice.summary()


def test_the_budget_cuts_alternatives_but_never_the_table_entry_or_bf16() -> None:
    """Pass 1 times bf16 and every group's built-in entry; pass 2 adds alternatives, slowest
    group against bf16 first, while the budget lasts."""
    w, q, s = _head()
    now = [0.0]
    ratios = {16: 0.5, 32: 0.7, 39: 0.6}  # int8 over bf16 per group: 32 first, then 39, then 16
    per_group = table_timer(lambda m, c: 1.0 if c == BF16 else ratios[m])

    def slow_timer(m: int, calls: Mapping[Any, Callable[[], Any]]) -> dict[Any, float]:
        now[0] += 1.0  # each measurement takes 1 s
        return per_group(m, calls)

    choice = calibrate.calibrate({layout.ROWS: q}, s, _bf16(w), max_rows=39, budget_s=4.5,
                               timer=slow_timer, clock=lambda: now[0])  # fmt: skip
    by_m = {g.m: g for g in choice.groups}
    assert by_m[32].skipped == 0 and by_m[39].skipped == 0 and by_m[32].tried > 2
    assert (by_m[16].tried, by_m[16].skipped > 0) == (1, True)  # the budget ran out first
    assert all(g.table_ms == ratios[g.m] and g.bf16_ms == 1.0 for g in choice.groups)
    assert f"{by_m[16].skipped} alternatives left out (budget 4 s)" in choice.summary()


def test_a_group_where_int8_loses_tries_every_candidate_whatever_the_budget() -> None:
    own = int8_kernel.select_config(32)
    rescue = int8_kernel.select_config(1)

    def times(m: int, choice: Any) -> float:
        if choice == BF16:
            return 1.0
        return 0.6 if choice == rescue else 1.4 if m == 32 else 0.5

    choice = _rows_choice(times, 32, budget_s=0.0)
    g16, g32 = choice.groups
    assert g16.tried == 1 and g32.skipped == 0
    assert (g32.table_ms, g32.best, choice.path) == (1.4, rescue, "int8")
    assert choice.table[1] == (32, rescue) and own != rescue


def test_an_alternative_within_the_noise_keeps_the_built_in_entry() -> None:
    own = int8_kernel.select_config(16)

    def times(m: int, choice: Any) -> float:
        return 1.0 if choice == BF16 else 0.50 if choice == own else 0.49  # 2% faster

    choice = _rows_choice(times, 16)
    assert choice.groups[0].best == own and choice.groups[0].tried > 1


def test_a_real_measurement_on_the_cpu_times_every_candidate() -> None:
    w, q, s = _head()
    choice = calibrate.calibrate({layout.ROWS: q}, s, _bf16(w), max_rows=20, timer=wall_timer,
                               budget_s=60.0)  # fmt: skip
    assert [g.m for g in choice.groups] == [16, 20]
    for g in choice.groups:
        assert g.bf16_ms > 0 and g.best_ms is not None and g.best_ms > 0
        assert g.tried == len(calibrate.candidates(g.m, layout.ROWS, CONFIG_TABLE)) >= 3
    assert choice.path == ("int8" if all(g.int8_wins for g in choice.groups) else BF16)


# --- the cache ------------------------------------------------------------------------------


def _choice() -> HeadChoice:
    return _rows_choice(lambda m, c: 1.0 if c == BF16 else 0.5, 20)


def test_the_key_names_gpu_driver_triton_shape_and_version() -> None:
    w, _, _ = _head()
    key = calibration_cache.key(w, 39)
    assert {"gpu", "capability", "driver", "cuda", "triton", "torch", "sparkserve", "shape",
            "dtype", "max_rows", "schema"} <= key.keys()  # fmt: skip
    assert key["shape"] == [N, K] and key["dtype"] == "torch.bfloat16" and key["max_rows"] == 39
    assert key != calibration_cache.key(w, 40)
    assert isinstance(calibration_cache.driver_version(), str)


def test_the_cache_round_trips_and_ignores_stale_or_corrupt_files(tmp_path: Path) -> None:
    path = calibration_cache.cache_path({"HF_HOME": str(tmp_path)})
    assert path == tmp_path / "sparkserve" / "lmhead-calibration.json"
    key = {"gpu": "NVIDIA GB10", "capability": "12.1", "triton": "3.8.0", "max_rows": 39}
    assert calibration_cache.load(path, key) == (None, "no cache file")
    choice = _choice()
    assert calibration_cache.store(path, key, choice) == ""
    cached, why = calibration_cache.load(path, key)
    assert why == "cache" and cached is not None
    assert (
        cached.table == choice.table and cached.groups == choice.groups and cached.source == "cache"
    )
    assert "from the cache" in cached.summary()

    stale, why = calibration_cache.load(path, {**key, "triton": "3.9.0"})
    assert stale is None and why == "stale cache (triton differ)"

    data = json.loads(path.read_text())
    corrupt = {
        "not json": "{",
        "a list": "[]",
        "unknown kind": json.dumps({**data, "choice": {**data["choice"], "table": [
            [16, {**data["choice"]["table"][0][1], "kind": "mma"}]]}}),
        "unknown field": json.dumps({**data, "choice": {**data["choice"], "table": [
            [16, {**data["choice"]["table"][0][1], "asm_cvt": True}]]}}),
        "bounds": json.dumps({**data, "choice": {**data["choice"], "table": [
            data["choice"]["table"][1], data["choice"]["table"][0]]}}),
        "wgmma on rows": json.dumps({**data, "choice": {**data["choice"], "table": [
            [1 << 62, {**data["choice"]["table"][0][1], "kind": "wgmma"}]]}}),
        "no choice": json.dumps({"key": key}),
    }  # fmt: skip
    for name, text in corrupt.items():
        path.write_text(text)
        got, why = calibration_cache.load(path, key)
        assert got is None and why.startswith("corrupt cache ignored"), (name, why)


def test_an_unwritable_cache_is_reported_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    why = calibration_cache.store(blocker / "sub" / "x.json", {}, _choice())
    assert why.startswith("cache not written")


# --- the plugin: knob, cache, log line ------------------------------------------------------


def _model(seed: int = 0) -> torch.nn.Module:
    method = pytest.importorskip("vllm.model_executor.layers.vocab_parallel_embedding")
    torch.manual_seed(seed)
    head = torch.nn.Module()
    head.weight = torch.nn.Parameter((torch.randn(N, K) * 0.02).to(torch.bfloat16),
                                     requires_grad=False)  # fmt: skip
    head.bias = None
    head.quant_method = method.UnquantizedEmbeddingMethod()
    head.quant_method.process_weights_after_loading(head)
    model = torch.nn.Module()
    model.lm_head = head
    return model


@pytest.fixture
def calibrating(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """The plugin calibrates on this CPU (torch path), with int8 timed at half of bf16; the
    cache under a fresh HF_HOME. Returns a list that grows by one per timed group."""
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv(plugin.CALIBRATE_ENV, raising=False)
    monkeypatch.setattr(plugin, "_calibratable", lambda weight: True)
    timed: list[int] = []

    def timer(m: int, calls: Mapping[Any, Callable[[], Any]]) -> dict[Any, float]:
        timed.append(m)
        return table_timer(lambda m, c: 1.0 if c == BF16 else 0.5)(m, calls)

    monkeypatch.setattr(calibrate, "event_timer", timer)
    return timed


def test_auto_measures_once_then_reuses_the_cache(
    calibrating: list[int], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    report = plugin.convert_model(_model(), max_rows=20)
    assert report.path == "int8" and report.choice["source"] == "measured"
    assert set(calibrating) == {16, 20}
    measured = len(calibrating)
    cache = tmp_path / "sparkserve" / "lmhead-calibration.json"
    assert json.loads(cache.read_text())["key"]["max_rows"] == 20
    with caplog.at_level(logging.INFO, logger="vllm.sparkserve.lmhead"):
        plugin._log(plugin.convert_model(_model(), max_rows=20))
    assert len(calibrating) == measured  # nothing measured the second time
    (line,) = [r.getMessage() for r in caplog.records if r.name == plugin.logger.name]
    assert line.startswith("sparkserve int8 lm-head: active (1024x128, torch kernel, rows layout)")
    assert "calibrated (from the cache" in line
    assert "M<=16 0.500 ms" in line
    assert "vs bf16 1.000, 2.00x" in line

    plugin.convert_model(_model(), max_rows=30)  # another MAX_NUM_SEQS: measured again
    assert 30 in calibrating[measured:]


def test_force_measures_despite_the_cache_and_off_uses_the_table(
    calibrating: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plugin.convert_model(_model(), max_rows=20)
    measured = len(calibrating)
    monkeypatch.setenv(plugin.CALIBRATE_ENV, "force")
    forced = plugin.convert_model(_model(), max_rows=20)
    assert forced.choice["source"] == "measured"
    assert forced.calibration.endswith("; SPARK_LMHEAD_CALIBRATE=force")
    assert len(calibrating) == 2 * measured
    monkeypatch.setenv(plugin.CALIBRATE_ENV, "off")
    report = plugin.convert_model(_model(), max_rows=20)
    assert report.path == "int8" and report.choice["source"] == "table"
    assert report.calibration == "built-in table (SPARK_LMHEAD_CALIBRATE=off)"
    assert len(calibrating) == 2 * measured
    monkeypatch.setenv(plugin.CALIBRATE_ENV, "sometimes")
    report = plugin.convert_model(_model(), max_rows=20)
    assert "SPARK_LMHEAD_CALIBRATE='sometimes': must be one of auto, force, off; using auto" in (
        report.calibration
    )


def test_a_corrupt_cache_is_rewritten(calibrating: list[int], tmp_path: Path) -> None:
    cache = tmp_path / "sparkserve" / "lmhead-calibration.json"
    cache.parent.mkdir(parents=True)
    cache.write_text("not json")
    report = plugin.convert_model(_model(), max_rows=20)
    assert report.choice["source"] == "measured"
    assert "corrupt cache ignored (JSONDecodeError" in report.calibration
    assert json.loads(cache.read_text())["choice"]["path"] == "int8"


def test_int8_losing_keeps_the_bf16_weight_and_says_so(
    calibrating: list[int], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(calibrate, "event_timer",
                        table_timer(lambda m, c: 1.0 if c == BF16 else 1.5))  # fmt: skip
    model = _model()
    weight = model.lm_head.weight
    with caplog.at_level(logging.INFO, logger="vllm.sparkserve.lmhead"):
        plugin._log(report := plugin.convert_model(model, max_rows=20))
    assert report.path == "bf16" and model.lm_head.weight is weight
    assert not hasattr(model.lm_head, "int8_weight")
    (line,) = [r.getMessage() for r in caplog.records if r.name == plugin.logger.name]
    assert line.startswith("sparkserve int8 lm-head: kept the bf16 head: calibrated (measured")
    assert "int8 (1.500 ms) is slower than bf16 (1.000 ms) at M=16" in line


def test_a_failing_calibration_keeps_bf16_and_never_raises(
    calibrating: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def broken(m: int, calls: Any) -> dict[Any, float]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    monkeypatch.setattr(calibrate, "event_timer", broken)
    model = _model()
    report = plugin.convert_model(model, max_rows=20)
    assert report.path == "bf16" and model.lm_head.weight.numel() == N * K
    assert report.reason == (
        "calibration failed (RuntimeError: CUDA error: an illegal memory access was encountered)"
    )
    assert not (tmp_path / "sparkserve" / "lmhead-calibration.json").exists()


def test_max_rows_comes_from_the_runners_vllm_config() -> None:
    from types import SimpleNamespace as NS

    runner = NS(vllm_config=NS(scheduler_config=NS(max_num_seqs=3),
                               speculative_config=NS(num_speculative_tokens=12)))  # fmt: skip
    assert plugin.max_rows(runner) == 39
    runner.vllm_config.speculative_config = None
    assert plugin.max_rows(runner) == 3
    # no vLLM config: the rows this launch exported, each launcher its own
    for launcher, rows in (("dflash", 3 * (12 + 1)), ("mtp", 3 * (2 + 1))):
        env = vllm_command(resolve_settings({}, launcher), "0.33.0", hybrid=True).env
        assert plugin.launcher_rows(env) == rows, launcher
        mine = {**env, "MAX_NUM_SEQS": "8", "NUM_SPEC_TOKENS": "4"}
        exported = vllm_command(resolve_settings(mine, launcher), "0.33.0", hybrid=True).env
        assert plugin.launcher_rows(exported) == 8 * (4 + 1), launcher
    # a vLLM no launcher started: the registry's defaults, also for a bad value
    assert plugin.launcher_rows({}) == plugin.launcher_rows({plugin.ROWS_ENV: "0"}) == 39
    assert plugin.max_rows(NS()) == plugin.launcher_rows()


# --- on a CUDA GPU: the real kernels under CUDA events ----------------------------------------

cuda_only = pytest.mark.skipif(
    not (torch.cuda.is_available() and int8_kernel.HAS_TRITON), reason="needs CUDA and Triton"
)


def _gpu_head(k: int = 1024) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """A 32768 x k bf16 head on the GPU, its int8 rows and scales, and its packed layouts."""
    dev = torch.device("cuda")
    w = (torch.randn(32768, k, device=dev) * 0.02).to(torch.bfloat16)
    q, s = int8_kernel.quantize_rows_int8(w)
    preferred = int8_kernel.preferred_layout(dev)
    return w, q, s, {preferred: layout.pack(q, preferred), layout.ROWS: q}


@cuda_only
def test_calibration_on_the_gpu_is_never_slower_than_bf16_and_graph_safe() -> None:
    dev = torch.device("cuda")
    k = 1024
    w, q, s, weights = _gpu_head(k)
    choice = calibrate.calibrate(weights, s, _bf16(w), max_rows=39)
    assert choice.source == "measured" and len(choice.groups) == 3
    for g in choice.groups:
        assert g.bf16_ms > 0 and g.best_ms is not None and g.table_ms is not None
        assert g.best_ms <= g.table_ms
    if choice.path != "int8":
        return
    wq = weights[choice.layout]
    x = torch.randn(39, k, device=dev, dtype=torch.bfloat16)
    int8_kernel.int8_linear(x, wq, s, weight_layout=choice.layout, table=choice.table)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = int8_kernel.int8_linear(
            x, wq, s, weight_layout=choice.layout, table=choice.table
        )
    x.copy_(torch.randn(39, k, device=dev, dtype=torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    ref = x.double() @ int8_kernel.dequantize_rows_int8(q, s, torch.float64).T
    assert float((captured.double() - ref).norm() / ref.norm()) < 1e-2


@cuda_only
def test_calibration_holds_no_gpu_memory_once_it_returns() -> None:
    """What the calibration allocates is gone before vLLM profiles the model's memory: anything
    left allocated comes out of the first start's KV pool (0.12 GiB on an H200 once)."""
    dev = torch.device("cuda")
    w, _, s, weights = _gpu_head()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(dev)
    choice = calibrate.calibrate(weights, s, _bf16(w), max_rows=39)
    torch.cuda.synchronize()
    assert choice.source == "measured"
    assert torch.cuda.memory_allocated(dev) == before
