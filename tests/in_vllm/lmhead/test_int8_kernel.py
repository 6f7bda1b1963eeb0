"""Tests of the int8 lm-head: quantisation and product on the CPU torch path; Triton on CUDA."""

from __future__ import annotations

import pytest
import torch

from sparkserve.in_vllm.lmhead import int8_kernel, layout
from sparkserve.in_vllm.lmhead.int8_kernel import (
    KernelConfig,
    dequantize_rows_int8,
    int8_linear,
    quantize_rows_int8,
    select_config,
)

CUDA_TRITON = torch.cuda.is_available() and int8_kernel.HAS_TRITON


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _weight(n: int, k: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return (torch.randn(n, k, generator=_gen(seed)) * 0.02).to(dtype)


def _hidden(m: int, k: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(m, k, generator=_gen(seed)).to(dtype)


def _reference(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    ref = x.double() @ dequantize_rows_int8(q, scale, torch.float64).T
    if bias is not None:
        ref = ref + bias.double()
    return ref


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


# --- quantisation ---------------------------------------------------------------------------


def test_quantize_round_trip_error_bound() -> None:
    w = _weight(300, 257, seed=1, dtype=torch.float32)
    w_before = w.clone()
    q, scale = quantize_rows_int8(w)
    assert torch.equal(w, w_before)  # the input is not modified
    assert q.dtype == torch.int8 and q.shape == w.shape
    assert scale.dtype == torch.float32 and scale.shape == (300,)
    assert int(q.abs().max()) <= 127
    # scale = rowwise absmax / 127, and every row's largest entry maps to +-127.
    torch.testing.assert_close(scale, w.abs().amax(dim=1) / 127.0)
    assert torch.all(q.abs().amax(dim=1) == 127)
    # Rounding to nearest: error at most half a step per element.
    err = (dequantize_rows_int8(q, scale) - w).abs()
    assert torch.all(err <= scale[:, None] * 0.5 + 1e-7)
    # And it is the nearest integer, not e.g. truncation.
    expected = torch.round(w.double() / scale.double()[:, None]).clamp(-127, 127).to(torch.int8)
    assert (q != expected).sum() <= 2  # float ties may differ by one on a handful of elements


def test_quantize_chunking_matches_single_chunk() -> None:
    w = _weight(1000, 96, seed=2)
    q1, s1 = quantize_rows_int8(w)
    q2, s2 = quantize_rows_int8(w, chunk_bytes=96 * 4 * 7)  # 7 rows a chunk, last one partial
    assert torch.equal(q1, q2)
    assert torch.equal(s1, s2)


def test_quantize_zero_rows_are_safe() -> None:
    w = _weight(64, 128, seed=3)
    w[[0, 17, 63]] = 0
    q, scale = quantize_rows_int8(w)
    assert torch.all(scale[[0, 17, 63]] == 0)
    assert torch.all(q[[0, 17, 63]] == 0)
    assert torch.isfinite(scale).all()
    x = _hidden(5, 128, seed=4)
    out = int8_linear(x, q, scale)
    assert torch.isfinite(out).all()
    assert torch.all(out[:, [0, 17, 63]] == 0)


def test_quantize_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        quantize_rows_int8(torch.zeros(3, 4, 5))
    with pytest.raises(TypeError):
        quantize_rows_int8(torch.zeros(3, 4, dtype=torch.int32))


# --- the product (torch path on the CPU) ----------------------------------------------------


@pytest.mark.parametrize(("n", "k"), [(64, 128), (1000, 96), (257, 131)])
@pytest.mark.parametrize("m", [1, 2, 13, 39, 64])
def test_int8_linear_matches_float64(n: int, k: int, m: int) -> None:
    w = _weight(n, k, seed=10 + n + k)
    q, scale = quantize_rows_int8(w)
    x = _hidden(m, k, seed=20 + m)
    out = int8_linear(x, q, scale)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    ref = _reference(x, q, scale)
    assert _rel_err(out, ref) < 1e-2  # bf16 output rounding is ~2e-3
    # fp32 output keeps the fp32 accumulation level.
    out32 = int8_linear(x.float(), q, scale)
    assert out32.dtype == torch.float32
    assert _rel_err(out32, ref) < 1e-5


@pytest.mark.parametrize("m", range(1, 65))
def test_every_m_from_1_to_64(m: int) -> None:
    n, k = 77, 48
    q, scale = quantize_rows_int8(_weight(n, k, seed=5))
    x = _hidden(m, k, seed=m, dtype=torch.float32)
    out = int8_linear(x, q, scale)
    assert out.shape == (m, n)
    assert _rel_err(out, _reference(x, q, scale)) < 1e-5


def test_chunked_torch_path_covers_every_column() -> None:
    n, k, m = 1001, 40, 3
    q, scale = quantize_rows_int8(_weight(n, k, seed=6, dtype=torch.float32))
    x = _hidden(m, k, seed=7, dtype=torch.float32)
    out = torch.full((m, n), float("nan"))
    int8_kernel._torch_int8_linear(x, q, scale, None, out, chunk_bytes=k * 4 * 64)  # 64-row chunks
    assert not out.isnan().any()
    assert _rel_err(out, _reference(x, q, scale)) < 1e-5


def test_bias_is_added_after_the_scaled_product() -> None:
    n, k, m = 130, 64, 4
    q, scale = quantize_rows_int8(_weight(n, k, seed=8))
    x = _hidden(m, k, seed=9)
    bias = torch.randn(n, generator=_gen(10)).to(torch.bfloat16)
    out = int8_linear(x, q, scale, bias)
    ref = _reference(x, q, scale, bias)
    assert _rel_err(out, ref) < 1e-2
    # A wrong placement (bias scaled with the product) would be far off.
    wrong = (x.double() @ q.double().T + bias.double()) * scale.double()
    assert _rel_err(out, wrong) > 1e-1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_output_dtype_and_leading_shape(dtype: torch.dtype) -> None:
    n, k = 50, 32
    q, scale = quantize_rows_int8(_weight(n, k, seed=11))
    x = _hidden(6, k, seed=12, dtype=dtype).reshape(2, 3, k)
    out = int8_linear(x, q, scale)
    assert out.dtype == dtype and out.shape == (2, 3, n)
    ref = _reference(x.reshape(6, k), q, scale).reshape(2, 3, n)
    assert _rel_err(out, ref) < 1e-2
    one = int8_linear(x[0, 0], q, scale)
    assert one.shape == (n,)


def test_poisoned_output_is_fully_written() -> None:
    n, k, m = 203, 72, 13
    q, scale = quantize_rows_int8(_weight(n, k, seed=13))
    x = _hidden(m, k, seed=14)
    buf = torch.full((m + 1, n + 5), float("nan"), dtype=torch.bfloat16)
    view = buf[:m, :n]
    int8_linear(x, q, scale, out=view)
    assert not view.isnan().any()
    assert buf[m:].isnan().all() and buf[:m, n:].isnan().all()  # nothing written outside
    assert _rel_err(view, _reference(x, q, scale)) < 1e-2


def test_wrong_math_is_detected() -> None:
    # The checks above must be able to fail: a product that forgets the scale is caught.
    n, k, m = 64, 64, 8
    q, scale = quantize_rows_int8(_weight(n, k, seed=15))
    x = _hidden(m, k, seed=16)
    ref = _reference(x, q, scale)
    assert _rel_err(x.double() @ q.double().T, ref) > 1.0
    assert _rel_err(int8_linear(x, q, scale * 1.05), ref) > 1e-2


def test_argument_checks() -> None:
    q, scale = quantize_rows_int8(_weight(8, 16, seed=17))
    with pytest.raises(ValueError):
        int8_linear(torch.zeros(2, 15), q, scale)
    with pytest.raises(ValueError):
        int8_linear(torch.zeros(2, 16), q, scale[:7])
    with pytest.raises(TypeError):
        int8_linear(torch.zeros(2, 16), q.float(), scale)
    with pytest.raises(ValueError):
        int8_linear(torch.zeros(2, 16), q, scale, out=torch.empty(3, 8))


def test_config_table_is_monotone_and_covers_large_m() -> None:
    bounds = [b for b, _ in int8_kernel.CONFIG_TABLE]
    assert bounds == sorted(bounds)
    for m in (1, 13, 39, 64, 65, 4096):
        cfg = select_config(m)
        assert cfg.kind in ("mmab", "gluon")
        assert cfg.block_m >= 16 or cfg.kind == "gluon"
        assert cfg.block_n >= 16 and cfg.block_k >= 16


def test_gluon_config_on_cpu_takes_the_torch_path() -> None:
    q, scale = quantize_rows_int8(torch.randn(40, 64) * 0.02)
    x = torch.randn(3, 64).to(torch.bfloat16)
    cfg = KernelConfig("gluon", 0, 128, 64, 4, 3)
    out = int8_linear(x, q, scale, config=cfg)
    assert _rel_err(out, _reference(x, q, scale)) < 1e-2


# --- the Triton kernel (CUDA only) ----------------------------------------------------------

cuda_only = pytest.mark.skipif(not CUDA_TRITON, reason="needs CUDA and Triton")


@cuda_only
@pytest.mark.parametrize(("n", "k"), [(1000, 256), (4099, 3072), (777, 200)])
@pytest.mark.parametrize("m", [1, 4, 13, 16, 39, 64, 100])
@pytest.mark.parametrize("kind", ["table", "mmab", "split3", "gluon"])
def test_triton_matches_float64(n: int, k: int, m: int, kind: str) -> None:
    dev = torch.device("cuda")
    w = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
    q, scale = quantize_rows_int8(w)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    bias = torch.randn(n, device=dev, dtype=torch.bfloat16)
    cfg = {
        "table": None,
        "mmab": KernelConfig("mmab", 16, 64, 64, 4, 3),
        "split3": KernelConfig("mmab", 16, 64, 64, 4, 3, split_m=3),
        "gluon": KernelConfig("gluon", 0, 128, 64, 4, 3),  # falls back where it cannot run
    }[kind]
    buf = torch.full((m + 1, n + 3), float("nan"), device=dev, dtype=torch.bfloat16)
    out = buf[:m, :n]
    int8_linear(x, q, scale, bias, out=out, config=cfg)
    torch.cuda.synchronize()
    assert not out.isnan().any()
    assert buf[m:].isnan().all() and buf[:m, n:].isnan().all()
    assert _rel_err(out, _reference(x, q, scale, bias)) < 1e-2


@cuda_only
def test_triton_in_cuda_graph() -> None:
    dev = torch.device("cuda")
    n, k, m = 5000, 512, 39
    q, scale = quantize_rows_int8((torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16))
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    eager = int8_linear(x, q, scale)  # compiles before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = int8_linear(x, q, scale)
    x.copy_(torch.randn(m, k, device=dev, dtype=torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel_err(captured, _reference(x, q, scale)) < 1e-2
    assert not torch.equal(captured, eager)


def test_fewer_stages_stops_at_two() -> None:
    cfg = KernelConfig("mmab", 16, 128, 128, 4, 4, split_m=2)
    assert int8_kernel.fewer_stages(cfg) == KernelConfig("mmab", 16, 128, 128, 4, 3, split_m=2)
    assert int8_kernel.fewer_stages(KernelConfig("mmab", 16, 128, 128, 4, 2)) is None


@cuda_only
def test_a_config_too_deep_for_the_gpu_runs_with_fewer_stages(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # 64 x 128 x 2 + 128 x 128 bytes per stage: 8 stages need 256 KiB, more than any GPU lets one
    # block use (227 KiB on an H200, 99 KiB on the Spark)
    monkeypatch.setattr(int8_kernel, "_FITTED", {})
    dev = torch.device("cuda")
    n, k, m = 1000, 1024, 64
    q, scale = quantize_rows_int8((torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16))
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    deep = KernelConfig("mmab", 64, 128, 128, 4, 8)
    with caplog.at_level("INFO", logger="vllm.sparkserve.lmhead"):
        out = int8_linear(x, q, scale, config=deep)
    assert _rel_err(out, _reference(x, q, scale)) < 1e-2
    (fitted,) = int8_kernel._FITTED.values()
    assert 2 <= fitted.num_stages < deep.num_stages
    assert "8 stages do not fit this GPU" in caplog.text


def test_a_failing_gluon_kernel_switches_to_triton_for_good(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(int8_kernel, "_FAILED", set())
    with caplog.at_level("WARNING", logger="vllm.sparkserve.lmhead"):
        int8_kernel._kernel_failed("wgmma", RuntimeError("unknown layout\nsecond line"))
    assert {"wgmma"} == int8_kernel._FAILED
    assert "wgmma kernel failed (RuntimeError: unknown layout); using the Triton kernel" in (
        caplog.text
    )


# --- the wgmma weight layout ------------------------------------------------------------------


@pytest.mark.parametrize(("n", "k"), [(1, 64), (127, 128), (128, 64), (300, 192), (1000, 3072)])
def test_wgmma_layout_round_trips_and_pads(n: int, k: int) -> None:
    q = torch.randint(-127, 128, (n, k), generator=_gen(n + k), dtype=torch.int8)
    packed = layout.pack(q, layout.WGMMA)
    assert packed.shape == (-(-n // 128) * 128, k)
    assert torch.equal(layout.unpack(packed, n, layout.WGMMA), q)
    # the padding rows are zero, so they can never add to anything
    assert not layout.row_block(packed, 0, packed.shape[0], layout.WGMMA)[n:].any()


def test_wgmma_layout_puts_a_threads_fragment_bytes_together() -> None:
    """Within a 64-column tile, thread t's 16 bytes (stored 16t .. 16t+15) are the logical
    columns of its A fragments over four k16 steps: 2t, 2t+1, 2t+8, 2t+9 (+16 per step)."""
    cols = layout.logical_columns(128, layout.WGMMA)
    assert sorted(cols.tolist()) == list(range(128))  # a permutation
    for t in range(4):
        frag = cols[16 * t : 16 * t + 16].tolist()
        assert frag == [16 * j + d + 2 * t for j in range(4) for d in (0, 1, 8, 9)]
    assert cols[64:].tolist() == [c + 64 for c in cols[:64].tolist()]
    # tiles: the first 128 x 64 bytes of memory are rows 0..127 of K-tile 0
    q = torch.arange(128 * 128, dtype=torch.int32).reshape(128, 128) % 127
    packed = layout.pack(q.to(torch.int8), layout.WGMMA).reshape(-1)
    tile0 = packed[: 128 * 64].reshape(128, 64)
    assert torch.equal(tile0, q.to(torch.int8)[:, cols[:64]])


@pytest.mark.parametrize(("n", "k", "m"), [(300, 192, 1), (300, 192, 39), (1000, 3072, 5)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_torch_path_reads_the_wgmma_layout(n: int, k: int, m: int, with_bias: bool) -> None:
    q, scale = quantize_rows_int8(_weight(n, k, seed=n + m))
    x = _hidden(m, k, seed=m)
    bias = _hidden(1, n, seed=7)[0] if with_bias else None
    packed = layout.pack(q, layout.WGMMA)
    out = int8_linear(x, packed, scale, bias, weight_layout=layout.WGMMA)
    assert out.shape == (m, n)
    # the same product summed in another K order: equal up to the bf16 output rounding
    rows = int8_linear(x, q, scale, bias)
    assert (out.double() - rows.double()).abs().max() <= 2 * rows.double().abs().max() * 2**-8
    assert _rel_err(out, _reference(x, q, scale, bias)) < 1e-2


def test_layout_arguments_are_checked() -> None:
    q, scale = quantize_rows_int8(_weight(200, 64, seed=3))
    x = _hidden(2, 64, seed=4)
    with pytest.raises(
        ValueError, match="unknown int8 weight layout 'tiles'; allowed: rows, wgmma"
    ):
        int8_linear(x, q, scale, weight_layout="tiles")
    with pytest.raises(ValueError, match="must have 256 rows"):
        int8_linear(x, q, scale, weight_layout=layout.WGMMA)  # not packed
    with pytest.raises(ValueError, match="multiple of 64"):
        layout.pack(q[:, :48], layout.WGMMA)
    with pytest.raises(ValueError, match="not aligned"):
        layout.row_block(layout.pack(q, layout.WGMMA), 0, 100, layout.WGMMA)
    assert int8_kernel.preferred_layout(torch.device("cpu")) == layout.ROWS


def test_wgmma_table_covers_every_m() -> None:
    for m in (1, 16, 17, 39, 48, 64, 65, 4096):
        cfg = select_config(m, layout.WGMMA)
        assert cfg.kind == ("wgmma" if m <= 64 else "mmab")
        assert cfg.block_n == layout.TILE_ROWS


# --- the wgmma layout's kernels (CUDA, sm_90 for the wgmma kernel itself) ---------------------

HOPPER = CUDA_TRITON and torch.cuda.get_device_capability() == (9, 0)


@cuda_only
@pytest.mark.parametrize(("n", "k"), [(1000, 256), (4099, 3072), (777, 192)])
@pytest.mark.parametrize("m", [1, 13, 16, 17, 26, 33, 39, 48, 64, 100])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fallback", [False, True])
def test_wgmma_layout_kernels_match_float64(
    n: int, k: int, m: int, dtype: torch.dtype, fallback: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table for the wgmma layout (mmab over tiles, the wgmma kernel, mmab 64-row blocks),
    and the Triton fallback that serves when the wgmma kernel cannot."""
    if fallback:
        monkeypatch.setattr(int8_kernel, "_FAILED", {"wgmma"})
    dev = torch.device("cuda")
    q, scale = quantize_rows_int8((torch.randn(n, k, device=dev) * 0.02).to(dtype))
    packed = layout.pack(q, layout.WGMMA)
    x = torch.randn(m, k, device=dev, dtype=dtype)
    bias = torch.randn(n, device=dev, dtype=dtype)
    buf = torch.full((m + 1, n + 3), float("nan"), device=dev, dtype=dtype)
    out = buf[:m, :n]
    int8_linear(x, packed, scale, bias, out=out, weight_layout=layout.WGMMA)
    torch.cuda.synchronize()
    assert not out.isnan().any()
    assert buf[m:].isnan().all() and buf[:m, n:].isnan().all()
    assert _rel_err(out, _reference(x, q, scale, bias)) < 1e-2


@cuda_only
@pytest.mark.skipif(not HOPPER, reason="the wgmma kernel needs an sm_90 GPU")
def test_wgmma_kernel_runs_and_replays_in_a_cuda_graph() -> None:
    from sparkserve.in_vllm.lmhead import int8_wgmma

    assert int8_wgmma.HAS_WGMMA
    dev = torch.device("cuda")
    n, k, m = 5000, 3072, 39
    q, scale = quantize_rows_int8((torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16))
    packed = layout.pack(q, layout.WGMMA)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    eager = int8_linear(x, packed, scale, weight_layout=layout.WGMMA)  # compiles before capture
    assert "wgmma" not in int8_kernel._FAILED
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = int8_linear(x, packed, scale, weight_layout=layout.WGMMA)
    x.copy_(torch.randn(m, k, device=dev, dtype=torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel_err(captured, _reference(x, q, scale)) < 1e-2
    assert not torch.equal(captured, eager)


@cuda_only
@pytest.mark.skipif(not HOPPER, reason="the wgmma kernel needs an sm_90 GPU")
@pytest.mark.parametrize(("n", "k"), [(4099, 3072), (300, 256)])
@pytest.mark.parametrize("m", [1, 8, 9, 33, 40, 41, 64])
@pytest.mark.parametrize(("stages", "x_stages", "chunks"), [(4, 2, 1), (3, 2, 1), (2, 2, 2)])
def test_wgmma_kernel_ring_depths(
    n: int, k: int, m: int, stages: int, x_stages: int, chunks: int
) -> None:
    """Weight and x rings of different depths (the loop unrolled by their lcm), every column
    split (8, 16, 32 + 8, 32 + 16, 64)."""
    from sparkserve.in_vllm.lmhead import int8_wgmma

    dev = torch.device("cuda")
    q, scale = quantize_rows_int8((torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16))
    packed = layout.pack(q, layout.WGMMA)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    buf = torch.full((m + 1, n + 3), float("nan"), device=dev, dtype=torch.bfloat16)
    out = buf[:m, :n]
    wcfg = int8_wgmma.WgmmaConfig(stages, chunks, True, True, x_stages)
    assert int8_wgmma.fit_config(x, k, wcfg) is not None  # the kernel itself runs, no fallback
    cfg = int8_kernel.KernelConfig(
        "wgmma", 0, 128, 64, 4, stages, split_cols=True, chunks=chunks, stagger=True,
        x_stages=x_stages,
    )  # fmt: skip
    int8_linear(x, packed, scale, out=out, config=cfg, weight_layout=layout.WGMMA)
    torch.cuda.synchronize()
    assert "wgmma" not in int8_kernel._FAILED
    assert not out.isnan().any()
    assert buf[m:].isnan().all() and buf[:m, n:].isnan().all()
    assert _rel_err(out, _reference(x, q, scale)) < 1e-2


@cuda_only
@pytest.mark.skipif(not HOPPER, reason="the wgmma kernel needs an sm_90 GPU")
def test_wgmma_kernel_takes_x_that_tma_cannot_address() -> None:
    """x whose base is not 16-byte aligned (TMA needs that) is copied first, not misread."""
    dev = torch.device("cuda")
    n, k, m = 1000, 256, 13
    q, scale = quantize_rows_int8((torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16))
    packed = layout.pack(q, layout.WGMMA)
    flat = torch.randn(m * k + 1, device=dev, dtype=torch.bfloat16)
    x = flat[1:].view(m, k)  # 2 bytes past an aligned base
    assert x.data_ptr() % 16
    out = int8_linear(x, packed, scale, weight_layout=layout.WGMMA)
    torch.cuda.synchronize()
    assert "wgmma" not in int8_kernel._FAILED
    assert _rel_err(out, _reference(x, q, scale)) < 1e-2
