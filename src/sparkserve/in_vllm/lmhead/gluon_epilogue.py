"""The epilogue the Gluon lm-head kernels share: per-row scale, bias, cast, masked store."""

# ruff: noqa: ANN001, ANN202

from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    HAS_GLUON = True
except Exception:  # pragma: no cover - depends on the Triton version
    gluon = None
    gl = None
    HAS_GLUON = False

__all__ = ["HAS_GLUON"]

if HAS_GLUON:

    @gluon.jit
    def store_scaled(
        acc,
        s_ptr,
        b_ptr,
        o_ptr,
        pid,
        col0,
        M,
        N,
        stride_om,
        HAS_BIAS: gl.constexpr,
        BLOCK_N: gl.constexpr,
        BM: gl.constexpr,
        NW: gl.constexpr,
    ):
        """``out[col0 + j, pid * BLOCK_N + i] = acc[i, j] * scale[row] (+ bias[row])``, for the
        rows below N and the columns below M; the store runs along N (out's contiguous dim)."""
        mma: gl.constexpr = acc.type.layout
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
        offs_om2 = col0 + gl.arange(0, BM, layout=gl.SliceLayout(0, o_l))
        o_ptrs = (
            o_ptr
            + gl.expand_dims(offs_om2.to(gl.int64) * stride_om, 0)
            + gl.expand_dims(offs_on2, 1)
        )
        o_mask = gl.expand_dims(offs_om2 < M, 0) & gl.expand_dims(offs_on2 < N, 1)
        gl.store(o_ptrs, y, mask=o_mask)

    @gluon.jit
    def store_split(
        acc,
        acc2,
        s_ptr,
        b_ptr,
        o_ptr,
        pid,
        M,
        N,
        stride_om,
        HAS_BIAS: gl.constexpr,
        BLOCK_N: gl.constexpr,
        BLOCK_M: gl.constexpr,
        BLOCK_M2: gl.constexpr,
        NW: gl.constexpr,
    ):
        """``store_scaled`` of x columns 0 .. BLOCK_M from ``acc`` and, where BLOCK_M2 > 0, of
        the next BLOCK_M2 columns from ``acc2`` (M split as, e.g., 32 + 8)."""
        store_scaled(
            acc, s_ptr, b_ptr, o_ptr, pid, 0, M, N, stride_om, HAS_BIAS, BLOCK_N, BLOCK_M, NW
        )
        if BLOCK_M2 > 0:
            store_scaled(
                acc2, s_ptr, b_ptr, o_ptr, pid, BLOCK_M, M, N, stride_om, HAS_BIAS, BLOCK_N,
                BLOCK_M2, NW,
            )  # fmt: skip
