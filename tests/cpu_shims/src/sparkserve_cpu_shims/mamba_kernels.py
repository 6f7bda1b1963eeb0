"""Fix 3: plain-torch versions of two Triton kernels in ``vllm/v1/worker/mamba_utils.py``.

With Mamba "align" mode (prefix caching on a hybrid model) and speculative decoding the
V1 runner launches ``precopy_mamba_align_fused_kernel`` (before the forward pass: move a
request's running state into its new block column) and ``postprocess_mamba_fused_kernel``
(after acceptance: save the state at the last block-aligned position). The CPU platform
replaces other Triton kernels through ``vllm.triton_utils.dispatcher.register_kernels``
but not these two, so without Triton the launch fails with ``'function' object is not
subscriptable``. We register torch versions through the same registry.

The kernels address memory by raw pointer (state tensor base + block id * block stride,
block ids read from the block tables by pointer). The runner collects those pointers in
``MambaSpecDecodeGPUContext._populate_metadata``; we wrap it to remember byte views of the
storages behind them, and the torch versions below resolve every pointer to a slice of one
of those views. The control flow follows the Triton code line by line; all integers are
non-negative, so Python's floor division equals Triton's.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

log = logging.getLogger("vllm.sparkserve_cpu_shims")

POSTPROCESS = "postprocess_mamba_fused_kernel"
PRECOPY = "precopy_mamba_align_fused_kernel"


class _Memory:
    """Byte views of the storages that the kernels' raw pointers point into."""

    def __init__(self) -> None:
        self._regions: dict[int, tuple[int, torch.Tensor]] = {}

    def add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        start = storage.data_ptr()
        if start not in self._regions:
            view = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
            self._regions[start] = (storage.nbytes(), view)

    def at(self, addr: int, nbytes: int) -> tuple[torch.Tensor, int]:
        for start, (size, view) in self._regions.items():
            if start <= addr and addr + nbytes <= start + size:
                return view, addr - start
        raise RuntimeError(f"sparkserve_cpu_shims: address {addr:#x} is in no known tensor")

    def copy(self, src: int, dst: int, nbytes: int) -> None:
        """memmove(dst, src, nbytes); the Triton copies are overlap-safe too."""
        if nbytes <= 0:
            return
        src_view, src_off = self.at(src, nbytes)
        dst_view, dst_off = self.at(dst, nbytes)
        dst_view[dst_off : dst_off + nbytes].copy_(src_view[src_off : src_off + nbytes].clone())

    def copy_rows(self, src: int, dst: int, rows: int, row_stride: int, nbytes: int) -> None:
        """Copy ``nbytes`` at the start of each of ``rows`` rows ``row_stride`` apart."""
        if nbytes <= 0 or rows <= 0:
            return
        span = (rows - 1) * row_stride + nbytes
        src_view, src_off = self.at(src, span)
        dst_view, dst_off = self.at(dst, span)
        shape, strides = (rows, nbytes), (row_stride, 1)
        rows_src = src_view.as_strided(shape, strides, src_off).clone()
        dst_view.as_strided(shape, strides, dst_off).copy_(rows_src)

    def read_i32(self, addr: int) -> int:
        view, off = self.at(addr, 4)
        return int(view[off : off + 4].view(torch.int32).item())


_memory = _Memory()


def _copy_mamba_state_block(
    state_idx: int,
    bt_row_idx: int,
    src_col: int,
    dst_col: int,
    token_bias: int,
    block_table_ptrs: list[int],
    block_table_stride_req: int,
    meta: dict[str, list[int]],
    conv_state_dim_first: bool,
) -> None:
    """Torch version of the Triton ``_copy_mamba_state_block`` (one layer/state)."""
    base = meta["base"][state_idx]
    block_stride = meta["block_stride"][state_idx]
    elem_size = meta["elem_size"][state_idx]
    inner_size = meta["inner_size"][state_idx]
    conv_width = meta["conv_width"][state_idx]
    table = block_table_ptrs[meta["group"][state_idx]]

    def block_id(col: int) -> int:
        return _memory.read_i32(table + 4 * (bt_row_idx * block_table_stride_req + col))

    dst_addr = base + block_id(dst_col) * block_stride

    if conv_state_dim_first and conv_width > 0:
        # (dim, state_len) layout: shift each dim row left by token_bias elements.
        src_block_addr = base + block_id(src_col) * block_stride
        _memory.copy_rows(
            src_block_addr + token_bias * elem_size,
            dst_addr,
            meta["dim_rows"][state_idx],
            meta["dim_row_stride"][state_idx],
            (conv_width - token_bias) * elem_size,
        )
        return

    if conv_width > 0:
        # (state_len, dim) layout: state[bt[src], bias:] -> state[bt[dst], :width - bias]
        src_block_addr = base + block_id(src_col) * block_stride
        token_bytes = inner_size * elem_size
        _memory.copy(
            src_block_addr + token_bias * token_bytes,
            dst_addr,
            (conv_width - token_bias) * token_bytes,
        )
        return

    # Temporal (SSM) state: state[bt[src + bias]] -> state[bt[dst]], natural size only.
    src_addr = base + block_id(src_col + token_bias) * block_stride
    _memory.copy(src_addr, dst_addr, inner_size * elem_size)


def _metadata(
    state_base_addrs_ptr: torch.Tensor,
    state_block_strides_ptr: torch.Tensor,
    state_elem_sizes_ptr: torch.Tensor,
    state_inner_sizes_ptr: torch.Tensor,
    state_conv_widths_ptr: torch.Tensor,
    state_group_indices_ptr: torch.Tensor,
    state_dim_row_count_ptr: torch.Tensor,
    state_dim_row_stride_ptr: torch.Tensor,
) -> dict[str, list[int]]:
    # Base addresses were stored as int64 bit patterns of uint64 pointers.
    return {
        "base": [a % (1 << 64) for a in state_base_addrs_ptr.tolist()],
        "block_stride": state_block_strides_ptr.tolist(),
        "elem_size": state_elem_sizes_ptr.tolist(),
        "inner_size": state_inner_sizes_ptr.tolist(),
        "conv_width": state_conv_widths_ptr.tolist(),
        "group": state_group_indices_ptr.tolist(),
        "dim_rows": state_dim_row_count_ptr.tolist(),
        "dim_row_stride": state_dim_row_stride_ptr.tolist(),
    }


def _block_tables(block_table_ptrs_ptr: torch.Tensor) -> list[int]:
    # Block-table addresses, like the state bases, are int64 bit patterns of uint64 pointers.
    return [a % (1 << 64) for a in block_table_ptrs_ptr.tolist()]


def _requests(
    num_reqs: int, has_idx_mapping: bool, idx_mapping_ptr: torch.Tensor | None
) -> Iterator[int]:
    """The request rows both kernels visit: every batch row, or its mapped row (-1: none)."""
    for batch_idx in range(num_reqs):
        if not has_idx_mapping:
            yield batch_idx
            continue
        assert idx_mapping_ptr is not None
        req_idx = int(idx_mapping_ptr[batch_idx])
        if req_idx >= 0:
            yield req_idx


def _copy_all_states(
    req_idx: int,
    src_block: int,
    dst_block: int,
    token_bias: int,
    tables: list[int],
    block_table_stride_req: int,
    meta: dict[str, list[int]],
    conv_state_dim_first: bool,
) -> None:
    for state_idx in range(len(meta["base"])):
        _copy_mamba_state_block(
            state_idx, req_idx, src_block, dst_block, token_bias,
            tables, block_table_stride_req, meta, conv_state_dim_first,
        )  # fmt: skip


def postprocess_mamba_fused_kernel(
    num_accepted_tokens_ptr: torch.Tensor,
    mamba_state_idx_ptr: torch.Tensor,
    num_scheduled_tokens_ptr: torch.Tensor | None,
    num_computed_tokens_ptr: torch.Tensor,
    num_draft_tokens_ptr: torch.Tensor | None,
    block_table_ptrs_ptr: torch.Tensor,
    block_table_stride_req: int,
    state_base_addrs_ptr: torch.Tensor,
    state_block_strides_ptr: torch.Tensor,
    state_elem_sizes_ptr: torch.Tensor,
    state_inner_sizes_ptr: torch.Tensor,
    state_conv_widths_ptr: torch.Tensor,
    state_group_indices_ptr: torch.Tensor,
    state_dim_row_count_ptr: torch.Tensor,
    state_dim_row_stride_ptr: torch.Tensor,
    num_accepted_tokens_out_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor | None,
    num_reqs: int,
    block_size: int,
    COPY_BLOCK_SIZE: int,  # Triton tuning constant, unused here
    CONV_STATE_DIM_FIRST: bool,
    HAS_IDX_MAPPING: bool = False,
    PRECOMPUTED_NEW_COMPUTED: bool = False,
    TEMPORAL_TILES: int = 1,  # GPU tiling, unused here
) -> None:
    meta = _metadata(
        state_base_addrs_ptr,
        state_block_strides_ptr,
        state_elem_sizes_ptr,
        state_inner_sizes_ptr,
        state_conv_widths_ptr,
        state_group_indices_ptr,
        state_dim_row_count_ptr,
        state_dim_row_stride_ptr,
    )
    tables = _block_tables(block_table_ptrs_ptr)
    for req_idx in _requests(num_reqs, HAS_IDX_MAPPING, idx_mapping_ptr):
        num_accepted = int(num_accepted_tokens_ptr[req_idx])
        src_block_idx = int(mamba_state_idx_ptr[req_idx])
        if PRECOMPUTED_NEW_COMPUTED:
            new_num_computed = int(num_computed_tokens_ptr[req_idx])
            running = new_num_computed - num_accepted + 1
        else:
            assert num_scheduled_tokens_ptr is not None and num_draft_tokens_ptr is not None
            running = (
                int(num_computed_tokens_ptr[req_idx])
                + int(num_scheduled_tokens_ptr[req_idx])
                - int(num_draft_tokens_ptr[req_idx])
            )
            new_num_computed = running + num_accepted - 1
        aligned_new_computed = (new_num_computed // block_size) * block_size
        if aligned_new_computed < running:
            continue  # no block boundary reached: nothing to save
        accept_token_bias = aligned_new_computed - running
        dest_block_idx = aligned_new_computed // block_size - 1
        if src_block_idx == dest_block_idx:
            num_accepted_tokens_out_ptr[req_idx] = 1
            if accept_token_bias == 0:
                continue  # no-op self-copy
        _copy_all_states(
            req_idx, src_block_idx, dest_block_idx, accept_token_bias,
            tables, block_table_stride_req, meta, CONV_STATE_DIM_FIRST,
        )  # fmt: skip


def precopy_mamba_align_fused_kernel(
    mamba_state_idx_ptr: torch.Tensor,
    src_col_ptr: torch.Tensor,
    token_bias_ptr: torch.Tensor,
    block_table_ptrs_ptr: torch.Tensor,
    block_table_stride_req: int,
    state_base_addrs_ptr: torch.Tensor,
    state_block_strides_ptr: torch.Tensor,
    state_elem_sizes_ptr: torch.Tensor,
    state_inner_sizes_ptr: torch.Tensor,
    state_conv_widths_ptr: torch.Tensor,
    state_group_indices_ptr: torch.Tensor,
    state_dim_row_count_ptr: torch.Tensor,
    state_dim_row_stride_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor | None,
    num_reqs: int,
    COPY_BLOCK_SIZE: int,  # Triton tuning constant, unused here
    CONV_STATE_DIM_FIRST: bool,
    HAS_IDX_MAPPING: bool = True,
    TEMPORAL_TILES: int = 1,  # GPU tiling, unused here
) -> None:
    meta = _metadata(
        state_base_addrs_ptr,
        state_block_strides_ptr,
        state_elem_sizes_ptr,
        state_inner_sizes_ptr,
        state_conv_widths_ptr,
        state_group_indices_ptr,
        state_dim_row_count_ptr,
        state_dim_row_stride_ptr,
    )
    tables = _block_tables(block_table_ptrs_ptr)
    for req_idx in _requests(num_reqs, HAS_IDX_MAPPING, idx_mapping_ptr):
        src_col = int(src_col_ptr[req_idx])
        dst_col = int(mamba_state_idx_ptr[req_idx])
        if src_col < 0 or src_col == dst_col:
            continue  # fresh state, or still in the same block
        token_bias = int(token_bias_ptr[req_idx])
        _copy_all_states(
            req_idx, src_col, dst_col, token_bias,
            tables, block_table_stride_req, meta, CONV_STATE_DIM_FIRST,
        )  # fmt: skip


def _params(fn: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(getattr(fn, "fn", fn)).parameters)


def patch(module: ModuleType) -> None:
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        log.info("sparkserve_cpu_shims: Triton can run here; fix 3 not needed")
        return
    from vllm.triton_utils.dispatcher import register_kernels

    impls = {POSTPROCESS: postprocess_mamba_fused_kernel, PRECOPY: precopy_mamba_align_fused_kernel}
    for name, impl in impls.items():
        if _params(getattr(module, name)) != _params(impl):
            raise RuntimeError(
                f"sparkserve_cpu_shims: {module.__name__}.{name} has a signature fix 3 "
                "does not know"
            )
    ctx_cls: Any = module.MambaSpecDecodeGPUContext
    populate = ctx_cls._populate_metadata
    if _params(populate) != (
        "self",
        "kv_cache_config",
        "forward_context",
        "mamba_state_copy_funcs",
        "block_tables",
        "aligned_index_block_tables",
    ):
        raise RuntimeError("sparkserve_cpu_shims: _populate_metadata changed; fix 3 stops")

    def populate_and_remember(
        self: Any,
        kv_cache_config: Any,
        forward_context: dict[str, Any],
        mamba_state_copy_funcs: Any,
        block_tables: list[torch.Tensor],
        aligned_index_block_tables: list[torch.Tensor],
    ) -> None:
        populate(
            self,
            kv_cache_config,
            forward_context,
            mamba_state_copy_funcs,
            block_tables,
            aligned_index_block_tables,
        )
        for group_id in self.mamba_group_ids:
            for layer_name in kv_cache_config.kv_cache_groups[group_id].layer_names:
                for state in forward_context[layer_name].kv_cache:
                    _memory.add(state)
        for table in (*block_tables, *aligned_index_block_tables):
            _memory.add(table)

    ctx_cls._populate_metadata = populate_and_remember
    register_kernels({f"{module.__name__}.{name}": impl for name, impl in impls.items()})
    log.info(
        "sparkserve_cpu_shims: fix 3 applied: %s and %s run as torch code",
        POSTPROCESS,
        PRECOPY,
    )
