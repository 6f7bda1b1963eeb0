"""Gluon (explicit-layout Triton) kernel for the weight-only int8 lm-head, M > 16 rows.

It computes ``out.T = W @ x.T`` with warp-level ``mma.sync`` (m16n8k16): the int8 weight is the
A operand, converted to bf16/fp16 once in registers and used for every 8-column block of ``x.T``.
Both the int8 weight tile and the x tile stream through a ``stages``-deep ``cp.async`` ring in
shared memory (16-byte copies). A ring slot holds one ``block_k`` step as ``block_k / k_slice``
separate slices of ``k_slice`` columns; an inner (unrolled) loop reads one slice of each operand
into fragment registers at a time, so the registers hold one slice, not the whole step (version 3;
``k_slice == block_k`` is version 2). The warps split the program's ``block_n`` weight rows
(``warps_m > 1`` also splits the x columns). With ``split_cols`` the x columns run as two
accumulators, a power of two plus 8 or 16 (M=39 as 32 + 8 instead of 64). Per-row scale and bias
are applied to the fp32 accumulator at the end.

Needs ``triton.experimental.gluon`` (Triton >= 3.6); ``HAS_GLUON`` says whether it imported.
"""

# ruff: noqa: ANN001, ANN202

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .launch import launch_rows_kernel

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

    from .gluon_epilogue import store_split

    _barrier = getattr(gl, "barrier", None) or gl.thread_barrier
    HAS_GLUON = True
except Exception:  # pragma: no cover - depends on the Triton version
    gluon = None
    gl = None
    mma_v2 = None
    async_copy = None
    _barrier = None
    HAS_GLUON = False

__all__ = [
    "HAS_GLUON",
    "GluonConfig",
    "gluon_int8_linear",
    "gluon_supported",
    "launch_constexprs",
]


@dataclasses.dataclass(frozen=True)
class GluonConfig:
    """``block_n`` weight rows per program (split over the warps along N), ``block_k`` columns per
    pipeline step, read in ``k_slice``-column slices; ``k_width`` is the dot-operand ``k_width``
    (consecutive K elements a thread holds per fragment); ``stages`` is the copy ring's depth;
    ``warps_m`` warps split the x columns (the rest split N); ``split_cols`` runs M as two
    accumulators (power of two + 8 or 16)."""

    block_n: int = 128
    block_k: int = 128
    num_warps: int = 4
    k_width: int = 8
    stages: int = 4
    k_slice: int = 32
    warps_m: int = 1
    split_cols: bool = False


def _next_pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def column_blocks(m: int, cfg: GluonConfig) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_M2): the x columns of the main and the second accumulator."""
    full = max(16, _next_pow2(m))
    if not cfg.split_cols or cfg.warps_m != 1:
        return full, 0
    bm = max(16, 1 << (m.bit_length() - 1))
    rem = m - bm
    if rem <= 0:
        return bm, 0
    bm2 = max(8, _next_pow2(rem))
    if bm + bm2 >= full:
        return full, 0
    return bm, bm2


def gluon_supported(x2: torch.Tensor, w_int8: torch.Tensor, cfg: GluonConfig) -> bool:
    k = w_int8.shape[1]
    return (
        HAS_GLUON
        and x2.is_cuda
        and x2.dtype in (torch.bfloat16, torch.float16)
        and k % cfg.block_k == 0
        and (k // cfg.block_k) % cfg.stages == 0
        and _layout_ok(x2.shape[0], cfg)
    )


def _layout_ok(m: int, cfg: GluonConfig) -> bool:
    """Shapes for which every layout covers its tile without replication (copies, mma)."""
    ks = cfg.k_slice
    if not (1 <= m <= 64 and ks in (32, 64, 128) and cfg.block_k % ks == 0):
        return False
    if cfg.num_warps % cfg.warps_m:
        return False
    nks = cfg.block_k // ks
    w0 = min(cfg.num_warps, nks)
    w1 = cfg.num_warps // w0
    bm, bm2 = column_blocks(m, cfg)
    x_rows = 32 // (ks // 8) * w1  # rows one pass of the x copy layout covers
    w_rows = 32 // (ks // 16) * w1
    return (
        nks % w0 == 0
        and cfg.num_warps % w0 == 0
        and bm >= x_rows
        and (bm2 == 0 or bm2 >= x_rows)
        and cfg.block_n % w_rows == 0
        and cfg.block_n % (16 * (cfg.num_warps // cfg.warps_m)) == 0
        and bm % (8 * cfg.warps_m) == 0
    )


def launch_constexprs(m: int, cfg: GluonConfig, has_bias: bool) -> dict[str, Any]:
    """The kernel's compile-time arguments for ``m`` rows (also used to compile it without a
    GPU in the tests)."""
    block_m, block_m2 = column_blocks(m, cfg)
    nks = cfg.block_k // cfg.k_slice
    w0 = min(cfg.num_warps, nks)
    return {
        "HAS_BIAS": has_bias,
        "BLOCK_N": cfg.block_n,
        "BLOCK_M": block_m,
        "BLOCK_M2": block_m2,
        "BLOCK_K": cfg.block_k,
        "KS": cfg.k_slice,
        "NKS": nks,
        "KW": cfg.k_width,
        "W0": w0,
        "W1": cfg.num_warps // w0,
        "NW": cfg.num_warps,
        "WM": cfg.warps_m,
        "STAGES": cfg.stages,
    }


def gluon_int8_linear(
    x2: torch.Tensor,
    w_int8: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    cfg: GluonConfig,
) -> Any:
    m, k = x2.shape
    n = w_int8.shape[0]
    grid = ((n + cfg.block_n - 1) // cfg.block_n,)
    return launch_rows_kernel(
        _int8_gluon_kernel, grid, x2, w_int8, scale, bias, out, m, n, k, cfg.num_warps,
        **launch_constexprs(m, cfg, bias is not None),
    )  # fmt: skip


if HAS_GLUON:

    @gluon.jit(do_not_specialize=["M"])
    def _int8_gluon_kernel(
        x_ptr,
        w_ptr,
        s_ptr,
        b_ptr,
        o_ptr,
        M,
        N,
        K,
        stride_xm,
        stride_wn,
        stride_om,
        HAS_BIAS: gl.constexpr,
        BLOCK_N: gl.constexpr,
        BLOCK_M: gl.constexpr,
        BLOCK_M2: gl.constexpr,
        BLOCK_K: gl.constexpr,
        KS: gl.constexpr,
        NKS: gl.constexpr,
        KW: gl.constexpr,
        W0: gl.constexpr,
        W1: gl.constexpr,
        NW: gl.constexpr,
        WM: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[2, 0], warps_per_cta=[NW // WM, WM], instr_shape=[16, 8]
        )
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=KW)
        b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=KW)
        # copy layouts: [slice, row, column-in-slice], 16 bytes per thread
        x_cl: gl.constexpr = gl.BlockedLayout(
            size_per_thread=[1, 1, 8],
            threads_per_warp=[1, 32 // (KS // 8), KS // 8],
            warps_per_cta=[W0, W1, 1],
            order=[2, 1, 0],
        )
        w_cl: gl.constexpr = gl.BlockedLayout(
            size_per_thread=[1, 1, 16],
            threads_per_warp=[1, 32 // (KS // 16), KS // 16],
            warps_per_cta=[W0, W1, 1],
            order=[2, 1, 0],
        )
        # shared tiles [STAGES, NKS, rows, KS], swizzled within each slice: written through a
        # 3-D layout (one copy per step), read as [STAGES * NKS, rows, KS] with a 2-D layout
        x_sl: gl.constexpr = gl.SwizzledSharedLayout(
            vec=8, per_phase=max(1, 128 // (KS * 2)), max_phase=KS // 8, order=[2, 1, 0]
        )
        w_sl: gl.constexpr = gl.SwizzledSharedLayout(
            vec=16, per_phase=max(1, 128 // KS), max_phase=KS // 16, order=[2, 1, 0]
        )
        x_sl2: gl.constexpr = gl.SwizzledSharedLayout(
            vec=8, per_phase=max(1, 128 // (KS * 2)), max_phase=KS // 8, order=[1, 0]
        )
        w_sl2: gl.constexpr = gl.SwizzledSharedLayout(
            vec=16, per_phase=max(1, 128 // KS), max_phase=KS // 16, order=[1, 0]
        )
        cdtype: gl.constexpr = x_ptr.dtype.element_ty

        pid = gl.program_id(0)
        # weight pointers [NKS, BLOCK_N, KS]
        w_s = gl.arange(0, NKS, layout=gl.SliceLayout(1, gl.SliceLayout(2, w_cl)))
        w_r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, gl.SliceLayout(2, w_cl)))
        w_c = gl.arange(0, KS, layout=gl.SliceLayout(0, gl.SliceLayout(1, w_cl)))
        rows_w = gl.minimum(pid * BLOCK_N + w_r, N - 1).to(gl.int64) * stride_wn
        w_ptrs = (
            w_ptr
            + gl.expand_dims(gl.expand_dims(w_s * KS, 1), 2)
            + gl.expand_dims(gl.expand_dims(rows_w, 0), 2)
            + gl.expand_dims(gl.expand_dims(w_c, 0), 1)
        )
        # x pointers [NKS, BLOCK_M, KS] (and [NKS, BLOCK_M2, KS] for the second block)
        x_s = gl.arange(0, NKS, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_cl)))
        x_c = gl.arange(0, KS, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_cl)))
        x_r = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, gl.SliceLayout(2, x_cl)))
        rows_x = gl.minimum(x_r, M - 1).to(gl.int64) * stride_xm
        x_sc = gl.expand_dims(gl.expand_dims(x_s * KS, 1), 2) + gl.expand_dims(
            gl.expand_dims(x_c, 0), 1
        )
        x_ptrs = x_ptr + x_sc + gl.expand_dims(gl.expand_dims(rows_x, 0), 2)
        x_sm = gl.allocate_shared_memory(cdtype, [STAGES, NKS, BLOCK_M, KS], x_sl)
        w_sm = gl.allocate_shared_memory(gl.int8, [STAGES, NKS, BLOCK_N, KS], w_sl)
        x_v = x_sm._reinterpret(cdtype, [STAGES * NKS, BLOCK_M, KS], x_sl2)
        w_v = w_sm._reinterpret(gl.int8, [STAGES * NKS, BLOCK_N, KS], w_sl2)
        if BLOCK_M2 > 0:
            x2_r = gl.arange(0, BLOCK_M2, layout=gl.SliceLayout(0, gl.SliceLayout(2, x_cl)))
            rows_x2 = gl.minimum(x2_r + BLOCK_M, M - 1).to(gl.int64) * stride_xm
            x2_ptrs = x_ptr + x_sc + gl.expand_dims(gl.expand_dims(rows_x2, 0), 2)
            x2_sm = gl.allocate_shared_memory(cdtype, [STAGES, NKS, BLOCK_M2, KS], x_sl)
            x2_v = x2_sm._reinterpret(cdtype, [STAGES * NKS, BLOCK_M2, KS], x_sl2)

        nk = K // BLOCK_K  # a multiple of STAGES: the ring's slot of every step is static
        for st in gl.static_range(STAGES - 1):  # prologue: tiles 0 .. STAGES-2 in flight
            async_copy.async_copy_global_to_shared(w_sm.index(st), w_ptrs + st * BLOCK_K)
            async_copy.async_copy_global_to_shared(x_sm.index(st), x_ptrs + st * BLOCK_K)
            if BLOCK_M2 > 0:
                async_copy.async_copy_global_to_shared(x2_sm.index(st), x2_ptrs + st * BLOCK_K)
            async_copy.commit_group()
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma)
        if BLOCK_M2 > 0:  # noqa: SIM108 (a static branch in Gluon)
            acc2 = gl.zeros([BLOCK_N, BLOCK_M2], gl.float32, mma)
        else:
            acc2 = acc  # never updated nor stored
        for i0 in range(0, nk, STAGES):
            for st in gl.static_range(STAGES):
                async_copy.wait_group(STAGES - 2)  # tile i0+st has landed (this thread's copies)
                _barrier()  # ... everyone's, and every warp is done with the previous slot
                # refill the previous tile's slot with tile i0+st+STAGES-1 (clamped at the end)
                j = gl.minimum(i0 + st + STAGES - 1, nk - 1)
                async_copy.async_copy_global_to_shared(
                    w_sm.index((st + STAGES - 1) % STAGES), w_ptrs + j * BLOCK_K
                )
                async_copy.async_copy_global_to_shared(
                    x_sm.index((st + STAGES - 1) % STAGES), x_ptrs + j * BLOCK_K
                )
                if BLOCK_M2 > 0:
                    async_copy.async_copy_global_to_shared(
                        x2_sm.index((st + STAGES - 1) % STAGES), x2_ptrs + j * BLOCK_K
                    )
                async_copy.commit_group()
                for kk in gl.static_range(NKS):
                    a = w_v.index(st * NKS + kk).load(a_l).to(cdtype)
                    xb = x_v.index(st * NKS + kk).permute([1, 0]).load(b_l)
                    acc = mma_v2(a, xb, acc)
                    if BLOCK_M2 > 0:
                        xb2 = x2_v.index(st * NKS + kk).permute([1, 0]).load(b_l)
                        acc2 = mma_v2(a, xb2, acc2)
        async_copy.wait_group(0)

        store_split(
            acc, acc2, s_ptr, b_ptr, o_ptr, pid, M, N, stride_om, HAS_BIAS, BLOCK_N, BLOCK_M,
            BLOCK_M2, NW,
        )  # fmt: skip
