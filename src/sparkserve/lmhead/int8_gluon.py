"""Gluon (explicit-layout Triton) kernel for the weight-only int8 lm-head, M > 16 rows.

It computes ``out.T = W @ x.T`` with warp-level ``mma.sync`` (m16n8k16): the int8 weight is the
A operand, converted to bf16/fp16 once in registers and used for every 8-column block of ``x.T``.
Both the int8 weight tile and the x tile stream through a ``stages``-deep ``cp.async`` ring in
shared memory (16-byte copies); each k-step reads the weight tile into A-fragment registers and
the x tile into B-fragment registers. The warps split the program's ``block_n`` weight rows, so
each weight byte is read and converted by exactly one thread. Per-row scale and bias are applied
to the fp32 accumulator at the end.

Needs ``triton.experimental.gluon`` (Triton >= 3.6); ``HAS_GLUON`` says whether it imported.
"""

# ruff: noqa: ANN001, ANN202

from __future__ import annotations

import dataclasses
from typing import Any

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

    _barrier = getattr(gl, "barrier", None) or gl.thread_barrier
    HAS_GLUON = True
except Exception:  # pragma: no cover - depends on the Triton version
    gluon = None
    gl = None
    mma_v2 = None
    async_copy = None
    _barrier = None
    HAS_GLUON = False

__all__ = ["HAS_GLUON", "GluonConfig", "gluon_int8_linear", "gluon_supported"]


@dataclasses.dataclass(frozen=True)
class GluonConfig:
    """``block_n`` weight rows per program (split over ``num_warps`` warps along N), ``block_k``
    columns per step; ``k_width`` is the dot-operand ``k_width`` (consecutive K elements a thread
    holds per fragment; 2 is the native bf16 fragment, 4 or 8 give wider weight loads)."""

    block_n: int = 128
    block_k: int = 64
    num_warps: int = 4
    k_width: int = 8
    stages: int = 4


def _next_pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def gluon_supported(x2: torch.Tensor, w_int8: torch.Tensor, cfg: GluonConfig) -> bool:
    k = w_int8.shape[1]
    return (
        HAS_GLUON
        and x2.is_cuda
        and x2.dtype in (torch.bfloat16, torch.float16)
        and k % cfg.block_k == 0
        and k >= cfg.block_k * cfg.stages
        and cfg.block_k >= 32
        and x2.shape[0] <= 64
    )


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
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    if w_int8.stride(1) != 1:
        w_int8 = w_int8.contiguous()
    scale = scale.to(dtype=torch.float32).contiguous()
    if bias is not None:
        bias = bias.contiguous()
    block_m = max(16, _next_pow2(m))
    xt_k = min(32, cfg.block_k // 8)
    grid = ((n + cfg.block_n - 1) // cfg.block_n,)
    with torch.cuda.device(x2.device):
        return _int8_gluon_kernel[grid](
            x2,
            w_int8,
            scale,
            bias if bias is not None else scale,
            out,
            m,
            n,
            k,
            x2.stride(0),
            w_int8.stride(0),
            out.stride(0),
            HAS_BIAS=bias is not None,
            BLOCK_N=cfg.block_n,
            BLOCK_M=block_m,
            BLOCK_K=cfg.block_k,
            KW=cfg.k_width,
            XT_K=xt_k,
            XT_M=32 // xt_k,
            SWZ=min(8, cfg.block_k // 8),
            NW=cfg.num_warps,
            WT_K=min(32, cfg.block_k // 16),
            STAGES=cfg.stages,
            num_warps=cfg.num_warps,
        )


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
        BLOCK_K: gl.constexpr,
        KW: gl.constexpr,
        XT_K: gl.constexpr,
        XT_M: gl.constexpr,
        SWZ: gl.constexpr,
        NW: gl.constexpr,
        WT_K: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[2, 0], warps_per_cta=[NW, 1], instr_shape=[16, 8]
        )
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=KW)
        b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=KW)
        x_l: gl.constexpr = gl.BlockedLayout(
            size_per_thread=[1, 8],
            threads_per_warp=[XT_M, XT_K],
            warps_per_cta=[NW, 1],
            order=[1, 0],
        )
        s_l: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=SWZ, order=[1, 0])
        w_cl: gl.constexpr = gl.BlockedLayout(
            size_per_thread=[1, 16],
            threads_per_warp=[32 // WT_K, WT_K],
            warps_per_cta=[NW, 1],
            order=[1, 0],
        )
        w_sl: gl.constexpr = gl.SwizzledSharedLayout(
            vec=16, per_phase=1, max_phase=WT_K, order=[1, 0]
        )
        cdtype: gl.constexpr = x_ptr.dtype.element_ty

        pid = gl.program_id(0)
        offs_wn = pid * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, w_cl))
        offs_wk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, w_cl))
        rows_w = gl.minimum(offs_wn, N - 1).to(gl.int64)
        w_ptrs = w_ptr + gl.expand_dims(rows_w * stride_wn, 1) + gl.expand_dims(offs_wk, 0)
        offs_xm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_l))
        offs_xk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, x_l))
        rows_m = gl.minimum(offs_xm, M - 1).to(gl.int64)
        x_ptrs = x_ptr + gl.expand_dims(rows_m * stride_xm, 1) + gl.expand_dims(offs_xk, 0)
        x_sm = gl.allocate_shared_memory(cdtype, [STAGES, BLOCK_M, BLOCK_K], s_l)

        w_sm = gl.allocate_shared_memory(gl.int8, [STAGES, BLOCK_N, BLOCK_K], w_sl)
        nk = K // BLOCK_K
        for st in gl.static_range(STAGES - 1):  # prologue: tiles 0 .. STAGES-2 in flight
            async_copy.async_copy_global_to_shared(w_sm.index(st), w_ptrs + st * BLOCK_K)
            async_copy.async_copy_global_to_shared(x_sm.index(st), x_ptrs + st * BLOCK_K)
            async_copy.commit_group()
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma)
        for i in range(nk):
            async_copy.wait_group(STAGES - 2)  # tile i has landed (this thread's copies)
            _barrier()  # ... everyone's, and every warp is done with tile i-1's slot
            slot = i % STAGES
            w = w_sm.index(slot).load(a_l)
            xb = x_sm.index(slot).permute([1, 0]).load(b_l)
            # refill the slot of tile i-1 with tile i+STAGES-1 (clamped: a re-copy at the end)
            j = gl.minimum(i + STAGES - 1, nk - 1)
            nslot = (i + STAGES - 1) % STAGES
            async_copy.async_copy_global_to_shared(w_sm.index(nslot), w_ptrs + j * BLOCK_K)
            async_copy.async_copy_global_to_shared(x_sm.index(nslot), x_ptrs + j * BLOCK_K)
            async_copy.commit_group()
            acc = mma_v2(w.to(cdtype), xb, acc)
        async_copy.wait_group(0)

        offs_on = pid * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
        rows_o = gl.minimum(offs_on, N - 1)
        s = gl.load(s_ptr + rows_o)
        y = acc * gl.expand_dims(s, 1)
        if HAS_BIAS:
            b = gl.load(b_ptr + rows_o).to(gl.float32)
            y = y + gl.expand_dims(b, 1)
        # store through a layout whose threads run along N (out's contiguous dimension)
        o_l: gl.constexpr = gl.BlockedLayout(
            size_per_thread=[8, 1], threads_per_warp=[16, 2], warps_per_cta=[1, NW], order=[0, 1]
        )
        y = gl.convert_layout(y.to(o_ptr.dtype.element_ty), o_l)
        offs_on2 = pid * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, o_l))
        offs_om2 = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, o_l))
        o_ptrs = (
            o_ptr
            + gl.expand_dims(offs_om2.to(gl.int64) * stride_om, 0)
            + gl.expand_dims(offs_on2, 1)
        )
        o_mask = gl.expand_dims(offs_om2 < M, 0) & gl.expand_dims(offs_on2 < N, 1)
        gl.store(o_ptrs, y, mask=o_mask)
