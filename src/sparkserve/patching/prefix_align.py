"""prefix-align: make the hash-block back-off in resolve_kv_cache_block_sizes align-aware.

With prefix caching on a hybrid (Mamba/GatedDeltaNet + attention) target and a drafter whose
attention page differs from the target's, page-size unification can leave the target's groups
at a multiple of cache_config.block_size (2240 -> 4480 on Qwen3.5-122B-A10B + DFlash). The
affected releases read "Mamba block != cache block" as "Mamba not in align mode" and back off
to hash_block_size = LCM of the group block sizes (4480), which the drafter's 2240-token group
does not divide, so HybridKVCacheCoordinator's divisibility assert stops the engine. An
align-mode Mamba group hashes fine at the GCD (2240), so the back-off must test the mode.
"""

from __future__ import annotations

import ast
import re

from sparkserve.patching.engine import Finding, LineSpan, Patch, PatchInfo, State

FUNCTION = "resolve_kv_cache_block_sizes"
BUGGY_TEST = re.compile(r"(\w+)\.kv_cache_spec\.block_size\s*!=\s*cache_config\.block_size")


def _attr_chain(node: ast.AST) -> list[str]:
    """`g.kv_cache_spec.block_size` -> ['g', 'kv_cache_spec', 'block_size']; [] if not a chain."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return []
    parts.append(node.id)
    return parts[::-1]


def _is_buggy_compare(node: ast.AST) -> bool:
    """`<g>.kv_cache_spec.block_size != cache_config.block_size`"""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
        return False
    left, right = _attr_chain(node.left), _attr_chain(node.comparators[0])
    return (
        isinstance(node.ops[0], ast.NotEq)
        and left[1:] == ["kv_cache_spec", "block_size"]
        and right == ["cache_config", "block_size"]
    )


def _is_align_compare(node: ast.AST) -> bool:
    """`<spec>.mamba_cache_mode != "align"`: the upstream fix's test."""
    return (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.NotEq)
        and isinstance(node.left, ast.Attribute)
        and node.left.attr == "mamba_cache_mode"
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value == "align"
    )


class PrefixAlignPatch(Patch):
    info = PatchInfo(
        name="prefix-align",
        target="v1/core/kv_cache_utils.py",
        description=(
            f"{FUNCTION}(): back off to hash_block_size = LCM only for Mamba groups whose "
            'mamba_cache_mode is not "align", instead of for every Mamba group whose block '
            "size differs from cache_config.block_size."
        ),
        why=(
            "Prefix caching with a DFlash drafter on a hybrid target (Qwen3.5-122B-A10B) stops "
            "engine start-up with 'block_size must be divisible by hash_block_size' in "
            "HybridKVCacheCoordinator; with the fix the hash block is the GCD (2240) and the "
            "coordinator builds."
        ),
        upstream=(
            "vLLM 0.28.0 replaced the block-size test with a mamba_cache_mode test in "
            "resolve_kv_cache_block_sizes (v1/core/kv_cache_utils.py)"
        ),
        affected="0.23.0 - 0.27.x",
        fixed_in="0.28.0",
    )

    def inspect(self, source: str) -> tuple[Finding, LineSpan | None]:
        where = f"{self.info.target}: {FUNCTION}()"
        function = self.one_function(source, FUNCTION)
        if isinstance(function, Finding):
            return function, None
        if any(_is_align_compare(node) for node in ast.walk(function)):
            return Finding(
                State.FIXED_UPSTREAM, f'{where} already tests mamba_cache_mode != "align"'
            ), None
        back_offs = [
            node
            for node in ast.walk(function)
            if isinstance(node, ast.If) and any(_is_buggy_compare(n) for n in ast.walk(node.test))
        ]
        expected = (
            f"expected one back-off 'if any(... <g>.kv_cache_spec.block_size != "
            f"cache_config.block_size ...)' in {where}"
        )
        if len(back_offs) != 1:
            return Finding(State.UNRECOGNISED, f"{expected}, found {len(back_offs)}"), None
        back_off = back_offs[0]
        start, end = back_off.lineno - 1, back_off.test.end_lineno or back_off.lineno
        lines = source.splitlines(keepends=True)
        header = "".join(lines[start:end])
        if not header.rstrip().endswith(":"):
            return Finding(
                State.UNRECOGNISED, f"{expected}, with its colon on the test's last line"
            ), None
        new_header, count = BUGGY_TEST.subn(r'\1.kv_cache_spec.mamba_cache_mode != "align"', header)
        if count != 1:
            return Finding(State.UNRECOGNISED, f"{expected}, written on its lines"), None
        detail = f"{where} lines {start + 1}-{end} back off on a block-size mismatch"
        return Finding(State.NEEDED, detail), LineSpan(
            start, end, new_header.splitlines(keepends=True)
        )


PREFIX_ALIGN = PrefixAlignPatch()
