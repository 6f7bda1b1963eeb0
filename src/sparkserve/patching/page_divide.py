"""hybrid-page-divide: unify KV page sizes by dividing the larger attention block, not by
multiplying every other layer's.

On a hybrid target (GatedDeltaNet + attention) with Mamba align mode, the platform sizes the
attention block so one attention page holds a GDN state, and pads the Mamba page to it
(`_align_hybrid_block_size`: 2240 tokens, 4,587,520 B on Qwen3.5-122B-A10B with DFlash n=12).
A DFlash drafter's attention page per token is twice the target's (8 KV heads x 128 against
2 x 256), so its page at 2240 tokens is twice the Mamba page. `unify_kv_cache_spec_page_size`
then grows every smaller page to the largest: the target's attention block to 4480 and every
Mamba page padded to 2.01x its state. The scheduler block becomes the LCM (4480), the hash
block the GCD (2240), which equals the Mamba block, so sub-block hits stay off
(`partial_hash_hits_enabled`) and prefix hits come in 4480-token units; the padding costs pool.

The patch adds one case before vLLM's own: when every Mamba page is one size and each larger
page belongs to a non-MLA attention layer whose page is k times it, with a block that k
divides into a multiple of 16, those layers take a block k times smaller (the drafter 2240 ->
1120) and every page is the Mamba page. Any other layout goes to vLLM's unchanged code.
"""

from __future__ import annotations

import ast

from sparkserve.patching.engine import Finding, LineSpan, Patch, PatchInfo, State

FUNCTION = "unify_kv_cache_spec_page_size"
# Names the added lines use; the function's own code must already use them (the module
# imports them), or the added lines would not run.
NAMES_USED = ("MambaSpec", "AttentionSpec", "MLAAttentionSpec", "replace")
# The smallest block the attention kernels are given on a Spark (vLLM's DEFAULT_BLOCK_SIZE
# in 0.33; FlashAttention and Triton take multiples of 16).
KERNEL_BLOCK = 16

ADDED = """\
# Every Mamba page one size, each larger page an attention layer's, k times it: that layer's
# block k times smaller (a multiple of {kernel}), so no page grows and no Mamba page is padded.
_mamba_pages = {{
    spec.page_size_bytes for spec in kv_cache_spec.values() if isinstance(spec, MambaSpec)
}}
if len(_mamba_pages) == 1:
    _base_page = next(iter(_mamba_pages))
    _divided = {{}}
    for _name, _spec in kv_cache_spec.items():
        _page = _spec.page_size_bytes
        if _page == _base_page:
            _divided[_name] = _spec
            continue
        _k = _page // _base_page
        if (
            not isinstance(_spec, AttentionSpec)
            or isinstance(_spec, MLAAttentionSpec)
            or getattr(_spec, "page_size_padded", None) is not None
            or _page % _base_page
            or _spec.block_size % ({kernel} * _k)
        ):
            break
        _smaller = replace(_spec, block_size=_spec.block_size // _k)
        if _smaller.page_size_bytes != _base_page:
            break
        _divided[_name] = _smaller
    else:
        return _divided
"""


def _is_block_size(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "block_size"


def _binops(function: ast.FunctionDef, op: type) -> list[ast.BinOp]:
    return [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.BinOp) and isinstance(node.op, op) and _is_block_size(node.left)
    ]


def _is_max_page_assign(node: ast.stmt) -> bool:
    """`max_page_size = max(page_sizes)`"""
    return (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == "max_page_size"
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "max"
    )


class PageDividePatch(Patch):
    function = FUNCTION  # what a plan puts in place (sparkserve.memory.patched_vllm)
    info = PatchInfo(
        name="hybrid-page-divide",
        target="v1/core/kv_cache_planning.py",
        description=(
            f"{FUNCTION}(): where an attention layer's page is k times the (single) Mamba page, "
            "give that layer a block k times smaller instead of growing every other layer's "
            "block k times and padding every Mamba page to k times its state."
        ),
        why=(
            "With a DFlash drafter on Qwen3.5-122B-A10B (Mamba align mode, prefix caching) the "
            "target's attention block doubles to 4480 and GDN pages are padded 2.01x: prefix "
            "hits come in 4480-token units and the padding costs KV pool. Divided, every group "
            "is at 2240 but the drafter's at 1120: hits in 1120-token units, pages padded 1.005x."
        ),
        upstream="not reported upstream yet (found by sparkserve, 2026-12-06; issue 50)",
        affected="0.32.0 - 0.34.0 (every release checked; 0.32 keeps the function in "
        "v1/core/kv_cache_utils.py)",
        fixed_in="none yet",
        former_target="v1/core/kv_cache_utils.py",
    )

    def inspect(self, source: str) -> tuple[Finding, LineSpan | None]:
        where = f"{self.info.target}: {FUNCTION}()"
        function = self.one_function(source, FUNCTION)
        if isinstance(function, Finding):
            return function, None
        if _binops(function, ast.FloorDiv):
            return Finding(
                State.FIXED_UPSTREAM, f"{where} already divides a layer's block_size"
            ), None
        grows = _binops(function, ast.Mult)
        if len(grows) != 1:
            return Finding(
                State.UNRECOGNISED,
                f"expected one '<spec>.block_size * ratio' in {where}, found {len(grows)}",
            ), None
        used = {node.id for node in ast.walk(function) if isinstance(node, ast.Name)}
        missing = [name for name in NAMES_USED if name not in used]
        if missing:
            return Finding(
                State.UNRECOGNISED, f"expected {where} to use {', '.join(missing)}"
            ), None
        assigns = [stmt for stmt in function.body if _is_max_page_assign(stmt)]
        if len(assigns) != 1:
            return Finding(
                State.UNRECOGNISED,
                f"expected one 'max_page_size = max(...)' in the body of {where}, "
                f"found {len(assigns)}",
            ), None
        start, end = assigns[0].lineno - 1, assigns[0].end_lineno or assigns[0].lineno
        lines = source.splitlines(keepends=True)
        indent = lines[start][: len(lines[start]) - len(lines[start].lstrip(" \t"))]
        kept = lines[start:end]
        if not kept[-1].endswith(("\n", "\r")):
            kept[-1] += "\n"
        added = [
            f"{indent}{line}\n" if line else "\n"
            for line in ADDED.format(kernel=KERNEL_BLOCK).splitlines()
        ]
        detail = f"{where} line {start + 1} grows the smaller pages' blocks to the largest page"
        return Finding(State.NEEDED, detail), LineSpan(start, end, [*added, *kept])


PAGE_DIVIDE = PageDividePatch()
