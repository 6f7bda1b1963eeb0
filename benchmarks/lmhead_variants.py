"""Kernel variants the benchmarks time but no dispatch table chooses (benchmarks/NOTES-lmhead.md).

``mma``: the swapped product ``W @ x.T`` in Triton (session 1's first version), kept so that
``lmhead_bench.py --sweep`` can still compare it with the served kernels. It was never faster than
the ``mmab`` kernel of ``sparkserve.in_vllm.lmhead.int8_kernel`` (0.247-0.257 ms against 0.196 at
M <= 16 on an H200). The other retired variants (``asm_cvt``, an inline-PTX int8 -> bf16
conversion, and ``mma_v2``, Triton's DISABLE_MMA_V3 switch) are described in the notes; their code
was removed from the served kernel after session 7 (git history has it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkserve.in_vllm.lmhead.int8_kernel import KernelConfig


def mma_int8_linear(
    x2: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor, out: torch.Tensor,
    cfg: KernelConfig,
) -> object:  # fmt: skip
    """``out = x2 @ (w_int8 * scale).T`` with the ``mma`` kernel (rows layout, no bias); returns
    the compiled kernel."""
    m, k = x2.shape
    n = scale.shape[0]
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    with torch.cuda.device(x2.device):
        return _int8_mma_kernel[grid](
            x2, w_int8, scale, scale, out, m, n, k, x2.stride(0), w_int8.stride(0),
            out.stride(0), HAS_BIAS=False, EVEN_K=k % cfg.block_k == 0, BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )  # fmt: skip


@triton.jit(do_not_specialize=["M"])
def _int8_mma_kernel(
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
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # acc[BLOCK_N, BLOCK_M] = W[n-block, :] @ x[m-block, :].T; int8 -> x dtype in registers.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_pid_m  # m varies fastest: programs sharing a weight tile run together
    pid_n = pid // num_pid_m
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    # Clamp instead of masking the loads: out-of-range rows re-read a valid row, never stored.
    rows_n = tl.minimum(offs_n, N - 1).to(tl.int64)
    rows_m = tl.minimum(offs_m, M - 1).to(tl.int64)
    w_ptrs = w_ptr + rows_n[:, None] * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + rows_m[:, None] * stride_xm + offs_k[None, :]
    cdtype = x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs)
            xv = tl.load(x_ptrs)
        else:
            k_ok = offs_k < K - k0
            w = tl.load(w_ptrs, mask=k_ok[None, :], other=0)
            xv = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)
        acc = tl.dot(w.to(cdtype), tl.trans(xv), acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    s = tl.load(s_ptr + rows_n)
    acc = acc * s[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows_n).to(tl.float32)[:, None]
    o_ptrs = o_ptr + offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None]
    o_mask = (offs_m[None, :] < M) & (offs_n[:, None] < N)
    tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=o_mask)
