"""Hopper (sm_90) kernel for the weight-only int8 lm-head: ``wgmma`` with the weight in registers.

It computes ``out.T = W @ x.T`` over a weight in the ``wgmma`` layout of ``layout``. One
warpgroup (4 warps) owns 128 weight rows: each step it reads one [128, 64] int8 tile from
shared memory with 16-byte loads, converts it to bf16/fp16 in registers and hands it to
``wgmma`` as the A operand straight from there; ``x.T`` is the B operand, which the tensor cores
read from shared memory once per 64 weight rows (with ``mma.sync`` every warp reads all of x
for every 16 weight rows, so such a kernel slows down with each extra 16 rows of x).

Because the layout permutes K so that a thread's A-fragment bytes for four k16 steps are
adjacent, the loaded tile only needs a relabelling (``reshape``/``permute``, checked to move no
data by ``convert_layout(..., assert_trivial=True)``) to become the A operand; because the tiles
of a row block are contiguous rows of 64 bytes, one TMA box of [128, 64] fetches a tile, and a
warp's 16-byte reads of it cover 512 contiguous bytes (no bank conflicts without a swizzle).

Weight and x tiles come by TMA (one thread issues a copy; an mbarrier per ring slot counts the
bytes in), through two rings: ``stages`` slots for the weight, which comes from HBM, and
``x_stages`` for x, which comes from L2 and needs less lead time. Rows of x past M are zero-filled
by the TMA unit. Every ring slot is its own shared-memory allocation and every slot index is
static (the loop is unrolled by the two depths' least common multiple), so Triton's barrier
analysis can tell the slots apart: one CTA barrier per step (copies by ``cp.async`` would need
several, and 128 threads issuing them). M up to 64 runs as one accumulator of
8, 16, 32 or 64 columns, or (``split_cols``) 32 + 8 for 33 to 40 rows and 32 + 16 for 41 to 48.
Per-row scale and bias are applied to the fp32 accumulator at the end.

Needs ``triton.experimental.gluon`` with its Hopper module (Triton >= 3.6); ``HAS_WGMMA`` says
whether it imported. Its measurements on an H200: benchmarks/NOTES-lmhead.md (the wgmma kernel).
"""

# ruff: noqa: ANN001, ANN202

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import torch

from .layout import PERM_CHUNK, TILE_ROWS

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .gluon_epilogue import store_split

    _barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # Triton < 3.7: thread_barrier
    HAS_WGMMA = True
except Exception:  # pragma: no cover - depends on the Triton version
    gluon = None
    gl = None
    HAS_WGMMA = False

__all__ = [
    "HAS_WGMMA",
    "MAX_M",
    "WgmmaConfig",
    "column_blocks",
    "fit_config",
    "launch_constexprs",
    "w_smem_layout",
    "wgmma_int8_linear",
    "x_smem_layout",
]

MAX_M = 64  # one program holds every x column in its accumulators
MAX_STAGES = 4  # ring slots per ring (each one its own allocation)


@dataclasses.dataclass(frozen=True)
class WgmmaConfig:
    """``stages`` weight-ring slots and ``x_stages`` x-ring slots (0: as many as ``stages``) of
    ``chunks`` x 64 K columns each; ``split_cols`` runs 33 to 48 rows as 32 + 8 or 32 + 16 columns
    instead of 64; ``stagger``: each program starts its walk over K at a different step."""

    stages: int = 3
    chunks: int = 1
    split_cols: bool = True
    stagger: bool = False
    x_stages: int = 0


def column_blocks(m: int, cfg: WgmmaConfig) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_M2): x columns of the main and the second accumulator (0: none)."""
    if cfg.split_cols and 32 < m <= 48:
        return 32, 8 if m <= 40 else 16
    return max(8, 1 << max(0, (m - 1).bit_length())), 0


def _fits_tma(x2: torch.Tensor) -> bool:
    # TMA: 16-byte aligned base and row stride, unit column stride
    row_bytes = x2.stride(0) * x2.element_size()
    return x2.stride(1) == 1 and x2.data_ptr() % 16 == 0 and row_bytes % 16 == 0


def fit_config(x2: torch.Tensor, k: int, cfg: WgmmaConfig) -> WgmmaConfig | None:
    """``cfg``, with its ring depths changed where their least common multiple does not divide
    K's steps (3 weight stages over K=2048's 32 steps become 4); None where the kernel cannot run
    at all."""
    if not (HAS_WGMMA and x2.is_cuda and x2.dtype in (torch.bfloat16, torch.float16)):
        return None
    return _fit(x2.shape[0], k, cfg)


@functools.lru_cache(maxsize=1024)  # called on every step: keep the host's work small
def _fit(m: int, k: int, cfg: WgmmaConfig) -> WgmmaConfig | None:
    step = PERM_CHUNK * cfg.chunks
    if not (1 <= m <= MAX_M and k % step == 0):
        return None
    nk = k // step
    x_stages = cfg.x_stages or cfg.stages
    for ws, xs in ((cfg.stages, x_stages), (4, min(x_stages, 4)), (4, 2), (2, 2), (3, 3)):
        if 2 <= ws <= MAX_STAGES and 2 <= xs <= MAX_STAGES and nk % math.lcm(ws, xs) == 0:
            return dataclasses.replace(cfg, stages=ws, x_stages=xs)
    return None


@functools.cache  # layouts are constexpr arguments: build them once, not on every call
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


@functools.cache
def x_smem_layout() -> Any:
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)


@functools.cache
def w_smem_layout() -> Any:
    # a warp's 16-byte reads cover 8 whole 64-byte rows: conflict-free without a swizzle
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)


_W_DESCRIPTORS: dict[tuple[int, tuple[int, ...]], Any] = {}


def _weight_descriptor(w_packed: torch.Tensor) -> Any:
    """The tiled weight as rows of 64 bytes (tile (block b, step t) is rows (b * K/64 + t) *
    128), described once per weight: the head's weight lives as long as the server."""
    key = (w_packed.data_ptr(), tuple(w_packed.shape))
    desc = _W_DESCRIPTORS.get(key)
    if desc is None:
        if len(_W_DESCRIPTORS) >= 8:  # weights come and go only in tests and benchmarks
            _W_DESCRIPTORS.clear()
        desc = TensorDescriptor.from_tensor(
            w_packed.view(-1, PERM_CHUNK), [TILE_ROWS, PERM_CHUNK], w_smem_layout()
        )
        _W_DESCRIPTORS[key] = desc
    return desc


def launch_constexprs(m: int, k: int, cfg: WgmmaConfig, has_bias: bool) -> dict[str, Any]:
    """The kernel's compile-time arguments for ``m`` rows and ``k`` columns (also used to compile
    it without a GPU in the tests)."""
    block_m, block_m2 = column_blocks(m, cfg)
    x_stages = cfg.x_stages or cfg.stages
    return {
        "HAS_BIAS": has_bias,
        "BLOCK_M": block_m,
        "BLOCK_M2": block_m2,
        "NKT": k // PERM_CHUNK,
        "WS": cfg.stages,
        "XS": x_stages,
        "UNROLL": math.lcm(cfg.stages, x_stages),
        "NCH": cfg.chunks,
        "W_LD": weight_load_layout(TILE_ROWS),
        "STAGGER": cfg.stagger,
    }


def wgmma_int8_linear(
    x2: torch.Tensor,
    w_packed: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    cfg: WgmmaConfig,
) -> Any:
    """``out = x2 @ (W * scale).T + bias`` for a ``w_packed`` in the wgmma layout and a ``cfg``
    from ``fit_config``; N is ``scale``'s length (the packed weight may carry padding rows)."""
    m, k = x2.shape
    n = scale.shape[0]
    if not _fits_tma(x2):
        x2 = x2.contiguous().clone()  # a fresh allocation is 16-byte aligned
    block_m, block_m2 = column_blocks(m, cfg)
    x_desc = TensorDescriptor.from_tensor(x2, [block_m, PERM_CHUNK], x_smem_layout())
    # the second accumulator's x rows start at block_m (without one, the kernel never reads it)
    x2_desc = (
        TensorDescriptor.from_tensor(x2, [block_m2, PERM_CHUNK], x_smem_layout())
        if block_m2
        else x_desc
    )
    w_desc = _weight_descriptor(w_packed)
    grid = (w_packed.shape[0] // TILE_ROWS,)
    with torch.cuda.device(x2.device):
        return _int8_wgmma_kernel[grid](
            x_desc,
            x2_desc,
            w_desc,
            scale,
            bias if bias is not None else scale,
            out,
            m,
            n,
            out.stride(0),
            **launch_constexprs(m, k, cfg, bias is not None),
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
    def _ring(dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr, N: gl.constexpr):
        """``N`` (2 to 4) separate shared-memory buffers, as a 4-tuple (unused entries repeat
        the first; they are never indexed)."""
        b0 = gl.allocate_shared_memory(dtype, shape, layout)
        b1 = gl.allocate_shared_memory(dtype, shape, layout)
        b2 = b0
        b3 = b0
        if N >= 3:
            b2 = gl.allocate_shared_memory(dtype, shape, layout)
        if N >= 4:
            b3 = gl.allocate_shared_memory(dtype, shape, layout)
        return (b0, b1, b2, b3)

    @gluon.jit
    def _bars(N: gl.constexpr):
        bars = _ring(gl.int64, [1], mbarrier.MBarrierLayout(), N)
        for i in gl.static_range(N):
            mbarrier.init(bars[i], count=1)
        return bars

    @gluon.jit
    def _load_w(w_desc, bar, dst, blk, t, pred, NKT: gl.constexpr, NCH: gl.constexpr,
                EXPECT: gl.constexpr = True):  # fmt: skip
        """Weight step t (NCH tiles) of row block blk into dst, counted on bar (EXPECT: the
        bytes are announced here, not by the caller)."""
        if EXPECT:
            mbarrier.expect(bar, NCH * 128 * 64, pred=pred)
        for c in gl.static_range(NCH):
            row = (blk * NKT + t * NCH + c) * 128
            tma.async_copy_global_to_shared(
                w_desc, [row, 0], bar, dst.slice(c * 128, 128, 0), pred=pred
            )

    @gluon.jit
    def _load_x(x_desc, x2_desc, bar, dst, dst2, t, pred, NCH: gl.constexpr, BM: gl.constexpr,
                BM2: gl.constexpr, EXPECT: gl.constexpr = True):  # fmt: skip
        """x step t: NCH tiles of BM rows (and of BM2 rows from row BM) into dst (dst2)."""
        if EXPECT:
            mbarrier.expect(bar, NCH * (BM + BM2) * 64 * 2, pred=pred)  # bf16 / fp16
        for c in gl.static_range(NCH):
            col = (t * NCH + c) * 64
            tma.async_copy_global_to_shared(
                x_desc, [0, col], bar, dst.slice(c * BM, BM, 0), pred=pred
            )
            if BM2 > 0:
                tma.async_copy_global_to_shared(
                    x2_desc, [BM, col], bar, dst2.slice(c * BM2, BM2, 0), pred=pred
                )

    @gluon.jit
    def _load_step(w_desc, x_desc, x2_desc, bar, w_dst, x_dst, x2_dst, blk, t, pred,
                   NKT: gl.constexpr, NCH: gl.constexpr, BM: gl.constexpr,
                   BM2: gl.constexpr):  # fmt: skip
        """Weight and x of step t counted on one barrier: one byte count announced for both
        (Triton puts a CTA barrier between each announcement and its copies)."""
        mbarrier.expect(bar, NCH * 64 * (128 + (BM + BM2) * 2), pred=pred)
        _load_w(w_desc, bar, w_dst, blk, t, pred, NKT, NCH, False)
        _load_x(x_desc, x2_desc, bar, x_dst, x2_dst, t, pred, NCH, BM, BM2, False)

    @gluon.jit(do_not_specialize=["M"])
    def _int8_wgmma_kernel(
        x_desc,
        x2_desc,
        w_desc,
        s_ptr,
        b_ptr,
        o_ptr,
        M,
        N,
        stride_om,
        HAS_BIAS: gl.constexpr,
        BLOCK_M: gl.constexpr,
        BLOCK_M2: gl.constexpr,
        NKT: gl.constexpr,
        WS: gl.constexpr,
        XS: gl.constexpr,
        UNROLL: gl.constexpr,
        NCH: gl.constexpr,
        W_LD: gl.constexpr,
        STAGGER: gl.constexpr,
    ):
        BLOCK_N: gl.constexpr = 128
        NW: gl.constexpr = gl.num_warps()
        BM2: gl.constexpr = BLOCK_M2 if BLOCK_M2 > 0 else 8  # shapes must be valid when unused
        cdtype: gl.constexpr = x_desc.dtype
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BLOCK_M, 16]
        )
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        mma2: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM2, 16]
        )
        a2_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma2, k_width=2)

        w_sl: gl.constexpr = w_desc.layout
        x_sl: gl.constexpr = x_desc.layout
        w_sm = _ring(gl.int8, [NCH * BLOCK_N, 64], w_sl, WS)
        x_sm = _ring(cdtype, [NCH * BLOCK_M, 64], x_sl, XS)
        if BLOCK_M2 > 0:  # noqa: SIM108 (a static branch in Gluon)
            x2_sm = _ring(cdtype, [NCH * BM2, 64], x_sl, XS)
        else:
            x2_sm = x_sm  # never read
        ONE_BAR: gl.constexpr = WS == XS  # equal rings: one barrier per step counts both
        w_bar = _bars(WS)
        if ONE_BAR:  # noqa: SIM108 (a static branch in Gluon)
            x_bar = w_bar
        else:
            x_bar = _bars(XS)
        fence_async_shared()  # barrier initialisation -> the TMA unit

        blk = gl.program_id(0)
        NS: gl.constexpr = NKT // NCH
        # STAGGER: program p walks K starting at step p % NS (and wraps), so that the programs
        # running at one time do not all read the same offset of their row blocks
        k_off = blk % NS if STAGGER else 0
        if ONE_BAR:
            for s in gl.static_range(WS - 1):  # prologue: the first steps in flight
                _load_step(w_desc, x_desc, x2_desc, w_bar[s], w_sm[s], x_sm[s], x2_sm[s], blk,
                           (s + k_off) % NS, True, NKT, NCH, BLOCK_M, BLOCK_M2)  # fmt: skip
        else:
            for s in gl.static_range(WS - 1):
                _load_w(w_desc, w_bar[s], w_sm[s], blk, (s + k_off) % NS, True, NKT, NCH)
            for s in gl.static_range(XS - 1):
                _load_x(x_desc, x2_desc, x_bar[s], x_sm[s], x2_sm[s], (s + k_off) % NS, True,
                        NCH, BLOCK_M, BLOCK_M2)  # fmt: skip
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma)
        acc2 = gl.zeros([BLOCK_N, BM2], gl.float32, mma2)
        for i0 in range(0, NS, UNROLL):
            for u in gl.static_range(UNROLL):
                i = i0 + u
                mbarrier.wait(w_bar[u % WS], (i // WS) & 1)
                if not ONE_BAR:
                    mbarrier.wait(x_bar[u % XS], (i // XS) & 1)
                _barrier()  # everyone is done with step i - 1's slots
                fence_async_shared()  # ... and with them in the generic proxy, before TMA writes
                jw = i + WS - 1  # refill the slots step i - 1 used
                jx = i + XS - 1
                if ONE_BAR:
                    _load_step(w_desc, x_desc, x2_desc, w_bar[(u + WS - 1) % WS],
                               w_sm[(u + WS - 1) % WS], x_sm[(u + WS - 1) % WS],
                               x2_sm[(u + WS - 1) % WS], blk, (jw + k_off) % NS, jw < NS, NKT,
                               NCH, BLOCK_M, BLOCK_M2)  # fmt: skip
                else:
                    _load_w(w_desc, w_bar[(u + WS - 1) % WS], w_sm[(u + WS - 1) % WS], blk,
                            (jw + k_off) % NS, jw < NS, NKT, NCH)  # fmt: skip
                    _load_x(x_desc, x2_desc, x_bar[(u + XS - 1) % XS], x_sm[(u + XS - 1) % XS],
                            x2_sm[(u + XS - 1) % XS], (jx + k_off) % NS, jx < NS, NCH, BLOCK_M,
                            BLOCK_M2)  # fmt: skip
                for c in gl.static_range(NCH):
                    w_tile = w_sm[u % WS].slice(c * BLOCK_N, BLOCK_N, 0)
                    a = _weight_fragment(w_tile, W_LD, a_l, cdtype)
                    xb = x_sm[u % XS].slice(c * BLOCK_M, BLOCK_M, 0).permute((1, 0))
                    acc = warpgroup_mma(a, xb, acc, is_async=True)
                    if BLOCK_M2 > 0:
                        a2 = gl.convert_layout(a, a2_l, assert_trivial=True)
                        xb2 = x2_sm[u % XS].slice(c * BM2, BM2, 0).permute((1, 0))
                        acc2 = warpgroup_mma(a2, xb2, acc2, is_async=True)
                        # at most this tile's products in flight: frees the last fragment
                        acc, acc2 = warpgroup_mma_wait(2, deps=[acc, acc2])
                    else:
                        acc = warpgroup_mma_wait(1, deps=[acc])
                # the slots are refilled next step
                if BLOCK_M2 > 0:
                    acc, acc2 = warpgroup_mma_wait(0, deps=[acc, acc2])
                else:
                    acc = warpgroup_mma_wait(0, deps=[acc])

        store_split(
            acc, acc2, s_ptr, b_ptr, o_ptr, blk, M, N, stride_om, HAS_BIAS, BLOCK_N, BLOCK_M,
            BLOCK_M2, NW,
        )  # fmt: skip
