"""One launch of a rows-layout kernel: the operands as the Triton and the Gluon int8 kernels read
them (rows of x and of the weight contiguous, float32 row scales, a contiguous bias) and the
argument order both share (x, int8 weight, row scales, bias, out, M, N, K, and the three row
strides). The kernels' own parameter lists spell that order out: Triton and Gluon compile a
kernel from its function's source, so its signature cannot come from a shared definition."""

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
    x2, w_int8, scale, bias = rows_operands(x2, w_int8, scale, bias)
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


def rows_operands(
    x2: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The operands as the kernels read them: x's and the weight's rows contiguous (copied only
    when they are not), the row scales as contiguous float32, the bias contiguous."""
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    if w_int8.stride(1) != 1:
        w_int8 = w_int8.contiguous()
    scale = scale.to(dtype=torch.float32).contiguous()
    return x2, w_int8, scale, bias.contiguous() if bias is not None else None
