"""cpu-conv-layout: vLLM's CPU GatedDeltaNet must hand its conv kernel the layout it checks.

On a CPU with AVX-512 BF16 or AMX (or Arm bf16) vLLM's CPU build runs the GatedDeltaNet's
prefill conv in its C++ kernel, `_causal_conv1d_fwd_cpu`, which refuses an `x` that is not the
(dim, tokens) transpose of a row-major (tokens, dim) buffer ("expect x to be transposed"). Its
callers pass `mixed_qkv[...].transpose(0, 1)`, where mixed_qkv is a column slice of the
projection: for a prefill of one token (a prompt sent again, all but its last token found in the
prefix cache) that slice counts as contiguous to `.contiguous()` yet keeps the projection's row
stride, the kernel refuses it, and the engine dies. Copying x to the kernel's layout when it is not
already in it fixes every caller; every other input passes through untouched.
"""

from __future__ import annotations

import ast

from sparkserve.patching.engine import (
    Finding,
    LineSpan,
    Patch,
    PatchInfo,
    State,
    statement_lines,
)

FUNCTION = "_causal_conv1d_fwd_cpu"
KERNEL = "causal_conv1d_fwd_cpu"

# Inserted before the function's first statement, at its indent.
FIX = (
    "# sparkserve: the kernel takes x only as the (dim, tokens) view of a row-major buffer\n",
    "if not (x.stride(-2) == 1 and x.stride(-1) == x.size(-2)):\n",
    "    x = x.transpose(-1, -2).clone(memory_format=torch.contiguous_format).transpose(-1, -2)\n",
)


def _calls_kernel(function: ast.FunctionDef) -> bool:
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == KERNEL
        for node in ast.walk(function)
    )


def _rebinds_x(function: ast.FunctionDef) -> bool:
    """The function assigns x itself: vLLM lays x out before the kernel (the upstream fix)."""
    return any(
        isinstance(node, ast.Name) and node.id == "x" and isinstance(node.ctx, ast.Store)
        for node in ast.walk(function)
    )


class CpuConvLayoutPatch(Patch):
    info = PatchInfo(
        name="cpu-conv-layout",
        target="model_executor/layers/mamba/ops/cpu/gdn_attention.py",
        description=(
            f"{FUNCTION}(): copy x to the layout the C++ kernel checks when it is not already in "
            "it."
        ),
        why=(
            "On an AVX-512 BF16, AMX or Arm-bf16 CPU a one-token prefill of a GatedDeltaNet "
            "model (a prompt sent again with prefix caching) kills vLLM's engine: "
            "'causal_conv1d_fwd_cpu: expect x to be transposed'."
        ),
        upstream="not reported upstream yet (found by sparkserve, 2026-12-06)",
        affected="0.32.0 - 0.34.0 (every release checked that has the function)",
        fixed_in="none yet",
    )

    def inspect(self, source: str) -> tuple[Finding, LineSpan | None]:
        where = f"{self.info.target}: {FUNCTION}()"
        function = self.one_function(source, FUNCTION)
        if isinstance(function, Finding):
            return function, None
        params = [arg.arg for arg in function.args.kwonlyargs + function.args.args]
        if "x" not in params or not _calls_kernel(function):
            return Finding(
                State.UNRECOGNISED,
                f"expected {where} to take x and call ops.{KERNEL}",
            ), None
        if _rebinds_x(function):
            return Finding(State.FIXED_UPSTREAM, f"{where} lays x out itself"), None
        body = function.body
        docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
        first = 1 if docstring else 0
        if first >= len(body):
            return Finding(State.UNRECOGNISED, f"{where} has no statements"), None
        # The fix goes before the first statement, which the region keeps whole (the marked
        # region stays a block of its own).
        statement = body[first]
        start, end = statement.lineno - 1, statement.end_lineno or statement.lineno
        indent, kept = statement_lines(source, start, end)
        detail = f"{where} passes x to the kernel in whatever layout it came"
        return Finding(State.NEEDED, detail), LineSpan(
            start, end, [*(f"{indent}{line}" for line in FIX), *kept]
        )


CPU_CONV_LAYOUT = CpuConvLayoutPatch()
