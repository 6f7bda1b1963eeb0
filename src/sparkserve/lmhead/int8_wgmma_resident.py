"""Hopper lm-head kernel for few rows of x: x resident in shared memory, the weight never is.

For M up to 32 the whole of x (``M x K`` bf16, padded to 8, 16 or 32 rows) fits in one SM's
shared memory (192 KB at 32 x 3072). So a persistent program loads x once, and then every
warpgroup streams its own 128-row blocks of the ``wgmma`` weight layout from global memory
straight into registers (16-byte loads, ``depth`` steps ahead: the registers are the pipeline),
converts them and issues ``wgmma`` with the weight as the register A operand and the resident x
as B. Nothing is written to shared memory in the main loop, so it needs no barrier; the weight
makes one trip (HBM -> registers) instead of three (HBM -> shared -> registers), and x is read
from L2 once per program instead of once per 128 weight rows.

Needs Gluon's Hopper module (``int8_wgmma.HAS_WGMMA``). Measured: benchmarks/NOTES-lmhead.md,
session 6.
"""

# ruff: noqa: ANN001, ANN202

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from . import int8_wgmma
from .layout import PERM_CHUNK, TILE_ROWS

if int8_wgmma.HAS_WGMMA:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from .gluon_epilogue import store_scaled

__all__ = ["MAX_M", "ResidentConfig", "fit_resident", "resident_int8_linear"]

MAX_M = 32
SMEM_PER_SM = 227 * 1024  # Hopper: what one program may allocate
SCRATCH_BYTES = 1024  # Triton's own allocations next to ours (barriers, alignment)


@dataclasses.dataclass(frozen=True)
class ResidentConfig:
    """``block_n`` weight rows per program (one warpgroup per 128), ``depth`` 64-column weight
    steps loaded ahead into registers, ``stagger``: programs start at different K offsets."""

    block_n: int = 2 * TILE_ROWS
    depth: int = 2
    stagger: bool = True


def x_rows(m: int) -> int:
    """x rows held in shared memory (the wgmma B operand's N): 8, 16 or 32."""
    return max(8, 1 << max(0, (m - 1).bit_length()))


def _smem_bytes(m: int, k: int, cfg: ResidentConfig, elem: int) -> int:
    # x, plus the epilogue's layout-conversion scratch (one output tile)
    return x_rows(m) * k * elem + cfg.block_n * x_rows(m) * elem + SCRATCH_BYTES


def fit_resident(x2: torch.Tensor, k: int, cfg: ResidentConfig) -> bool:
    """Whether this kernel can run ``x2`` (M x K) with ``cfg`` on x2's device."""
    return (
        int8_wgmma.HAS_WGMMA
        and x2.is_cuda
        and x2.dtype in (torch.bfloat16, torch.float16)
        and 1 <= x2.shape[0] <= MAX_M
        and k % PERM_CHUNK == 0
        and cfg.block_n in (TILE_ROWS, 2 * TILE_ROWS, 4 * TILE_ROWS)
        and cfg.depth in (1, 2, 3, 4)
        and (k // PERM_CHUNK) % cfg.depth == 0
        and _smem_bytes(x2.shape[0], k, cfg, x2.element_size()) <= SMEM_PER_SM
    )


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def resident_int8_linear(
    x2: torch.Tensor,
    w_packed: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    cfg: ResidentConfig,
) -> Any:
    """``out = x2 @ (W * scale).T + bias`` for a ``w_packed`` in the wgmma layout (N =
    ``scale``'s length); call only where ``fit_resident`` holds."""
    m, k = x2.shape
    n = scale.shape[0]
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    warps = 4 * (cfg.block_n // TILE_ROWS)
    n_tiles = -(-w_packed.shape[0] // cfg.block_n)
    per_sm = max(1, SMEM_PER_SM // _smem_bytes(m, k, cfg, x2.element_size()))
    per_sm = min(per_sm, 16 // warps)  # at most 16 warps (2048 threads' registers) per SM
    grid = (min(n_tiles, _sm_count(x2.device.index or 0) * per_sm),)
    with torch.cuda.device(x2.device):
        return _resident_kernel[grid](
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
            n_tiles,
            HAS_BIAS=bias is not None,
            BLOCK_N=cfg.block_n,
            BLOCK_M=x_rows(m),
            NK=k // PERM_CHUNK,
            DEPTH=cfg.depth,
            W_LD=int8_wgmma.weight_load_layout(cfg.block_n, warps),
            STAGGER=cfg.stagger,
            num_warps=warps,
        )


if int8_wgmma.HAS_WGMMA:

    @gluon.jit
    def _fragment(w, a_l: gl.constexpr, cdtype: gl.constexpr):
        """A [BLOCK_N, 64] int8 tile in registers (stored order) -> A-fragment registers."""
        BLOCK_N: gl.constexpr = w.shape[0]
        w = w.to(cdtype)
        # stored column 16t + 4j + 2eh + el is logical column 16j + 8eh + 2t + el
        w = w.reshape([BLOCK_N, 4, 4, 2, 2]).permute([0, 2, 3, 1, 4]).reshape([BLOCK_N, 64])
        return gl.convert_layout(w, a_l, assert_trivial=True)

    @gluon.jit
    def _mma(w, x_sm, t, acc, a_l: gl.constexpr, cdtype: gl.constexpr):
        """acc += W tile (int8 registers) @ x tile t of the resident x, one product in flight."""
        a = _fragment(w, a_l, cdtype)
        acc = warpgroup_mma(a, x_sm.index(t).permute((1, 0)), acc, is_async=True)
        return warpgroup_mma_wait(1, deps=[acc])

    @gluon.jit
    def _step(w_ptrs, i, k_off, NK: gl.constexpr):
        """Pointers to K step ``i`` (clamped to the last one: loads past the end repeat it)."""
        t = (gl.minimum(i, NK - 1) + k_off) % NK
        return w_ptrs + t * (128 * 64)

    @gluon.jit(do_not_specialize=["M"])
    def _resident_kernel(
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
        n_tiles,
        HAS_BIAS: gl.constexpr,
        BLOCK_N: gl.constexpr,
        BLOCK_M: gl.constexpr,
        NK: gl.constexpr,
        DEPTH: gl.constexpr,
        W_LD: gl.constexpr,
        STAGGER: gl.constexpr,
    ):
        BK: gl.constexpr = 64
        TR: gl.constexpr = 128
        NW: gl.constexpr = gl.num_warps()
        cdtype: gl.constexpr = x_ptr.dtype.element_ty
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BLOCK_M, 16]
        )
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        x_cl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
        x_sl: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )

        # x, all of it, once: NK tiles of [BLOCK_M, 64]; rows past M are zero-filled
        x_sm = gl.allocate_shared_memory(cdtype, [NK, BLOCK_M, BK], x_sl)
        xr = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_cl))
        xc = gl.arange(0, BK, layout=gl.SliceLayout(0, x_cl))
        x_ptrs = (
            x_ptr
            + gl.expand_dims(gl.minimum(xr, M - 1).to(gl.int64) * stride_xm, 1)
            + gl.expand_dims(xc, 0)
        )
        x_mask = gl.expand_dims(xr < M, 1) & gl.expand_dims(xc >= 0, 0)
        for t in range(NK):
            async_copy.async_copy_global_to_shared(x_sm.index(t), x_ptrs + t * BK, mask=x_mask)
        async_copy.commit_group()
        async_copy.wait_group(0)
        fence_async_shared()  # cp.async writes (generic proxy) -> wgmma reads (async proxy)
        gl.thread_barrier()

        r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, W_LD))
        c = gl.arange(0, BK, layout=gl.SliceLayout(0, W_LD))
        last_blk = (N - 1) // TR
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            # row r of the program's tile is row r % 128 of 128-row block tile * BLOCK_N/128 +
            # r // 128 (clamped: a block past the weight repeats the last one, never stored)
            blk = gl.minimum(tile * (BLOCK_N // TR) + r // TR, last_blk)
            w_row = blk.to(gl.int64) * K * TR + (r % TR) * BK
            w_ptrs = w_ptr + gl.expand_dims(w_row, 1) + gl.expand_dims(c, 0)
            k_off = tile % NK if STAGGER else 0
            acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma)
            # DEPTH steps per iteration, all loaded before the first is used. The loaded int8
            # is never carried from one iteration to the next: a loop-carried int8 tile costs
            # a byte repack (PRMT) per element
            for i0 in range(0, NK, DEPTH):
                w0 = gl.load(_step(w_ptrs, i0, k_off, NK))
                if DEPTH >= 2:
                    w1 = gl.load(_step(w_ptrs, i0 + 1, k_off, NK))
                if DEPTH >= 3:
                    w2 = gl.load(_step(w_ptrs, i0 + 2, k_off, NK))
                if DEPTH >= 4:
                    w3 = gl.load(_step(w_ptrs, i0 + 3, k_off, NK))
                acc = _mma(w0, x_sm, (i0 + k_off) % NK, acc, a_l, cdtype)
                if DEPTH >= 2:
                    acc = _mma(w1, x_sm, (i0 + 1 + k_off) % NK, acc, a_l, cdtype)
                if DEPTH >= 3:
                    acc = _mma(w2, x_sm, (i0 + 2 + k_off) % NK, acc, a_l, cdtype)
                if DEPTH >= 4:
                    acc = _mma(w3, x_sm, (i0 + 3 + k_off) % NK, acc, a_l, cdtype)
            acc = warpgroup_mma_wait(0, deps=[acc])
            store_scaled(
                acc, s_ptr, b_ptr, o_ptr, tile, 0, M, N, stride_om, HAS_BIAS, BLOCK_N, BLOCK_M, NW
            )
