"""One launch of a rows-layout kernel: the argument order the Triton and the Gluon int8 kernels
share (x, int8 weight, row scales, bias, out, M, N, K, and the three row strides)."""

from __future__ import annotations

from typing import Any

import torch


def launch_rows_kernel(
    kernel: Any,
    grid: tuple[int, ...],
    x2: torch.Tensor,
    w_int8: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    m: int,
    n: int,
    k: int,
    num_warps: int,
    **options: Any,
) -> Any:
    """`kernel[grid](...)` on x's device; `options`: the kernel's constexprs and launch options.
    Without a bias the scale pointer stands in for it (never read: HAS_BIAS is false)."""
    with torch.cuda.device(x2.device):
        return kernel[grid](
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
            num_warps=num_warps,
            **options,
        )
