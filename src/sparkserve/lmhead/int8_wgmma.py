"""Hopper (sm_90) kernel for the weight-only int8 lm-head: ``wgmma`` with the weight in registers.

It computes ``out.T = W @ x.T`` over a weight in the ``wgmma`` layout of ``layout``. One
warpgroup (4 warps) owns ``block_n`` = 128 weight rows: each step it reads one [128, 64] int8
tile from shared memory with 16-byte loads, converts it to bf16/fp16 in registers and hands it to
``wgmma`` as the A operand straight from there; ``x.T`` is the B operand, which the tensor cores
read from shared memory once per 64 weight rows. With ``mma.sync`` every warp had to read all of x
for every 16 weight rows, which is what made the earlier kernels slow down with each extra 16
rows of x.

Because the layout permutes K so that a thread's A-fragment bytes for four k16 steps are
adjacent, the loaded tile only needs a relabelling (``reshape``/``permute``, checked to move no
data by ``convert_layout(..., assert_trivial=True)``) to become the A operand, and because the
tiles of a row block are contiguous, every step's copy is one contiguous run of memory.

Weight and x tiles stream through a ``stages``-deep ``cp.async`` ring (zero-filled rows of x
past M are not read: many threads copying one clamped row is slow). M up to 64 runs as one
accumulator of 16, 32 or 64 columns, or (``split_cols``) 32 + 16 for 33 to 48 rows. Per-row scale
and bias are applied to the fp32 accumulator at the end. Every ring slot index is static (the
loop is unrolled by ``stages``), so K / (64 * ``chunks``) must be a multiple of ``stages``
(``fit_config`` adjusts the stage count).

Needs ``triton.experimental.gluon`` with its Hopper module (Triton >= 3.6); ``HAS_WGMMA`` says
whether it imported. Measured on an H200: benchmarks/NOTES-lmhead.md, session 5.
"""

# ruff: noqa: ANN001, ANN202

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .layout import PERM_CHUNK, TILE_ROWS

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from .gluon_epilogue import store_scaled

    _barrier = getattr(gl, "barrier", None) or gl.thread_barrier
    HAS_WGMMA = True
except Exception:  # pragma: no cover - depends on the Triton version
    gluon = None
    gl = None
    async_copy = None
    fence_async_shared = None
    warpgroup_mma = None
    warpgroup_mma_wait = None
    _barrier = None
    HAS_WGMMA = False

__all__ = [
    "HAS_WGMMA",
    "MAX_M",
    "WgmmaConfig",
    "column_blocks",
    "fit_config",
    "wgmma_int8_linear",
]

MAX_M = 64  # one program holds every x column in its accumulators


@dataclasses.dataclass(frozen=True)
class WgmmaConfig:
    """``stages`` ring slots of ``chunks`` x 64 K columns each; ``split_cols`` runs 33 to 48 rows
    as 32 + 16 columns instead of 64. ``block_n`` is the layout's tile height (128)."""

    stages: int = 3
    chunks: int = 1
    split_cols: bool = True
    block_n: int = TILE_ROWS
    stagger: bool = False


def _next_pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def column_blocks(m: int, cfg: WgmmaConfig) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_M2): x columns of the main and the second accumulator (0: none)."""
    full = max(16, _next_pow2(m))
    if cfg.split_cols and 32 < m <= 48:
        return 32, 16
    return full, 0


def fit_config(x2: torch.Tensor, k: int, cfg: WgmmaConfig) -> WgmmaConfig | None:
    """``cfg``, with its stage count changed where it does not divide K's steps (3 stages over
    K=2048's 32 steps become 4); None where the kernel cannot run at all."""
    step = PERM_CHUNK * cfg.chunks
    if not (
        HAS_WGMMA
        and x2.is_cuda
        and x2.dtype in (torch.bfloat16, torch.float16)
        and 1 <= x2.shape[0] <= MAX_M
        and k % step == 0
        and cfg.block_n == TILE_ROWS
    ):
        return None
    nk = k // step
    for stages in (cfg.stages, 4, 2, 3, 6, 8):
        if stages <= nk and nk % stages == 0:
            return dataclasses.replace(cfg, stages=stages)
    return None


def weight_load_layout(block_n: int, num_warps: int = 4) -> Any:
    """Register layout of one [block_n, 64] weight tile as read from shared memory: thread
    (warp w, lane 4g + t) holds rows rep*16*num_warps + 16w + 8h + g and stored columns
    16t .. 16t + 15, which after ``_weight_fragment``'s relabelling is the wgmma A layout."""
    reg = [[0, 1], [0, 2], [0, 4], [0, 8], [8, 0]]
    warp = [[16 << i, 0] for i in range(num_warps.bit_length() - 1)]
    rep = 16 * num_warps
    while rep < block_n:
        reg.append([rep, 0])
        rep *= 2
    return gl.DistributedLinearLayout(
        reg_bases=reg,
        lane_bases=[[0, 16], [0, 32], [1, 0], [2, 0], [4, 0]],
        warp_bases=warp,
        block_bases=[],
        shape=[block_n, 64],
    )


def wgmma_int8_linear(
    x2: torch.Tensor,
    w_packed: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    cfg: WgmmaConfig,
) -> Any:
    """``out = x2 @ (W * scale).T + bias`` for a ``w_packed`` in the wgmma layout; N is
    ``scale``'s length (the packed weight may carry padding rows)."""
    m, k = x2.shape
    n = scale.shape[0]
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    block_m, block_m2 = column_blocks(m, cfg)
    grid = (w_packed.shape[0] // cfg.block_n,)
    with torch.cuda.device(x2.device):
        return _int8_wgmma_kernel[grid](
            x2,
            w_packed,
            scale,
            bias if bias is not None else scale,
            out,
            m,
            n,
            k,
            x2.stride(0),
            out.stride(0),
            HAS_BIAS=bias is not None,
            BLOCK_N=cfg.block_n,
            BLOCK_M=block_m,
            BLOCK_M2=block_m2,
            STAGES=cfg.stages,
            NCH=cfg.chunks,
            W_LD=weight_load_layout(cfg.block_n),
            STAGGER=cfg.stagger,
            num_warps=4,
        )


if HAS_WGMMA:

    @gluon.jit
    def _weight_fragment(w_sm, W_LD: gl.constexpr, a_l: gl.constexpr, cdtype: gl.constexpr):
        """One [BLOCK_N, 64] int8 tile (stored order) -> A-fragment registers of cdtype."""
        BLOCK_N: gl.constexpr = w_sm.shape[0]
        w = w_sm.load(W_LD).to(cdtype)
        # stored column 16t + 4j + 2eh + el is logical column 16j + 8eh + 2t + el
        w = w.reshape([BLOCK_N, 4, 4, 2, 2]).permute([0, 2, 3, 1, 4]).reshape([BLOCK_N, 64])
        return gl.convert_layout(w, a_l, assert_trivial=True)

    @gluon.jit
    def _x_pointers(x_ptr, row0, M, stride_xm, ROWS: gl.constexpr, STEP: gl.constexpr, x_cl):
        r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, x_cl))
        c = gl.arange(0, STEP, layout=gl.SliceLayout(0, x_cl))
        rows = gl.minimum(row0 + r, M - 1).to(gl.int64) * stride_xm
        ptrs = x_ptr + gl.expand_dims(rows, 1) + gl.expand_dims(c, 0)
        # padding rows are zero-filled, not read
        mask = gl.expand_dims(row0 + r < M, 1) & gl.expand_dims(c >= 0, 0)
        return ptrs, mask

    @gluon.jit(do_not_specialize=["M"])
    def _int8_wgmma_kernel(
        x_ptr,
        w_ptr,
        s_ptr,
        b_ptr,
        o_ptr,
        M,
        N,
        K,
        stride_xm,
        stride_om,
        HAS_BIAS: gl.constexpr,
        BLOCK_N: gl.constexpr,
        BLOCK_M: gl.constexpr,
        BLOCK_M2: gl.constexpr,
        STAGES: gl.constexpr,
        NCH: gl.constexpr,
        W_LD: gl.constexpr,
        STAGGER: gl.constexpr = False,
    ):
        BK: gl.constexpr = 64  # one tile; a pipeline step (ring slot) is NCH tiles
        STEP: gl.constexpr = BK * NCH
        NW: gl.constexpr = gl.num_warps()
        cdtype: gl.constexpr = x_ptr.dtype.element_ty
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BLOCK_M, 16]
        )
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        # 16-byte copies: weight [NCH * BLOCK_N, 64] (one contiguous run), x [rows, STEP]
        w_cl: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [NW, 1], [1, 0])
        x_cl: gl.constexpr = gl.BlockedLayout(
            [1, 8], [32 // (STEP // 8), STEP // 8], [NW, 1], [1, 0]
        )
        # 16-byte vectors XOR-swizzled by row: conflict-free A-fragment reads
        w_sl: gl.constexpr = gl.SwizzledSharedLayout(16, 1, 4, order=[1, 0])
        x_sl: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )

        pid = gl.program_id(0)
        w_r = gl.arange(0, NCH * BLOCK_N, layout=gl.SliceLayout(1, w_cl))
        w_c = gl.arange(0, BK, layout=gl.SliceLayout(0, w_cl))
        w_ptrs = (
            w_ptr
            + pid.to(gl.int64) * K * BLOCK_N
            + gl.expand_dims(w_r * BK, 1)
            + gl.expand_dims(w_c, 0)
        )
        W_STEP: gl.constexpr = STEP * BLOCK_N
        x_ptrs, x_mask = _x_pointers(x_ptr, 0, M, stride_xm, BLOCK_M, STEP, x_cl)
        w_sm = gl.allocate_shared_memory(gl.int8, [STAGES, NCH * BLOCK_N, BK], w_sl)
        x_sm = gl.allocate_shared_memory(cdtype, [STAGES, BLOCK_M, STEP], x_sl)
        if BLOCK_M2 > 0:
            mma2: gl.constexpr = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BLOCK_M2, 16]
            )
            a2_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma2, k_width=2)
            x2_ptrs, x2_mask = _x_pointers(x_ptr, BLOCK_M, M, stride_xm, BLOCK_M2, STEP, x_cl)
            x2_sm = gl.allocate_shared_memory(cdtype, [STAGES, BLOCK_M2, STEP], x_sl)

        nk = K // STEP
        # STAGGER: program p walks K starting at step p % nk (and wraps), so that the programs
        # running at one time do not all read the same offset of their row blocks
        k_off = pid % nk if STAGGER else 0
        for st in gl.static_range(STAGES - 1):  # prologue: steps 0 .. STAGES-2 in flight
            t = (st + k_off) % nk
            async_copy.async_copy_global_to_shared(w_sm.index(st), w_ptrs + t * W_STEP)
            async_copy.async_copy_global_to_shared(x_sm.index(st), x_ptrs + t * STEP, mask=x_mask)
            if BLOCK_M2 > 0:
                async_copy.async_copy_global_to_shared(
                    x2_sm.index(st), x2_ptrs + t * STEP, mask=x2_mask
                )
            async_copy.commit_group()
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma)
        if BLOCK_M2 > 0:
            acc2 = gl.zeros([BLOCK_N, BLOCK_M2], gl.float32, mma2)
        for i0 in range(0, nk, STAGES):
            for st in gl.static_range(STAGES):
                async_copy.wait_group(STAGES - 2)  # step i0+st has landed (this thread's copies)
                fence_async_shared()  # cp.async writes (generic proxy) -> wgmma reads (async)
                _barrier()  # everyone's copies; and everyone is done with the previous slot
                # the step to fetch (clamped at the end: the last copies repeat, unused)
                j = (gl.minimum(i0 + st + STAGES - 1, nk - 1) + k_off) % nk
                async_copy.async_copy_global_to_shared(
                    w_sm.index((st + STAGES - 1) % STAGES), w_ptrs + j * W_STEP
                )
                async_copy.async_copy_global_to_shared(
                    x_sm.index((st + STAGES - 1) % STAGES), x_ptrs + j * STEP, mask=x_mask
                )
                if BLOCK_M2 > 0:
                    async_copy.async_copy_global_to_shared(
                        x2_sm.index((st + STAGES - 1) % STAGES), x2_ptrs + j * STEP, mask=x2_mask
                    )
                async_copy.commit_group()
                for c in gl.static_range(NCH):
                    w_tile = w_sm.index(st).slice(c * BLOCK_N, BLOCK_N, 0)
                    a = _weight_fragment(w_tile, W_LD, a_l, cdtype)
                    xb = x_sm.index(st).slice(c * BK, BK, 1).permute((1, 0))
                    acc = warpgroup_mma(a, xb, acc, is_async=True)
                    if BLOCK_M2 > 0:
                        a2 = gl.convert_layout(a, a2_l, assert_trivial=True)
                        xb2 = x2_sm.index(st).slice(c * BK, BK, 1).permute((1, 0))
                        acc2 = warpgroup_mma(a2, xb2, acc2, is_async=True)
                        # at most this tile's products in flight: frees the last fragment
                        acc, acc2 = warpgroup_mma_wait(2, deps=[acc, acc2])
                    else:
                        acc = warpgroup_mma_wait(1, deps=[acc])
                # the slot is refilled next step
                if BLOCK_M2 > 0:
                    acc, acc2 = warpgroup_mma_wait(0, deps=[acc, acc2])
                else:
                    acc = warpgroup_mma_wait(0, deps=[acc])
        async_copy.wait_group(0)

        store_scaled(
            acc, s_ptr, b_ptr, o_ptr, pid, 0, M, N, stride_om, HAS_BIAS, BLOCK_N, BLOCK_M, NW
        )
        if BLOCK_M2 > 0:
            store_scaled(
                acc2, s_ptr, b_ptr, o_ptr, pid, BLOCK_M, M, N, stride_om, HAS_BIAS, BLOCK_N,
                BLOCK_M2, NW,
            )  # fmt: skip
