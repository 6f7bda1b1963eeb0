"""Weight-only int8 lm-head: per-row quantisation and the matching matmul."""

from sparkserve.in_vllm.lmhead.int8_kernel import int8_linear, quantize_rows_int8

__all__ = ["int8_linear", "quantize_rows_int8"]
