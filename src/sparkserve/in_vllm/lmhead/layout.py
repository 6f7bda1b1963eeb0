"""How the int8 head weight is stored: plain rows, or the tiled and K-permuted "wgmma" layout.

``rows``: ``(N, K)`` row-major, as ``quantize_rows_int8`` returns it. Every kernel reads it.

``wgmma`` (Hopper, sm_90): built for ``int8_wgmma``'s kernel, where the weight is the wgmma A
operand taken straight from registers.

- K is permuted inside every 64-column chunk: stored column ``16t + 4j + 2eh + el`` holds
  logical column ``16j + 8eh + 2t + el``. Thread ``t`` (lane % 4) of a warp then finds the
  bytes of its A fragments for four k16 steps next to each other and reads them with one 16-byte
  load; x is read in the same permuted order (a dot product does not care about the order of K,
  only that both sides agree).
- The matrix is stored as ``[TILE_ROWS, 64]`` tiles: the K tiles of one 128-row block one after
  the other, then the next row block. A kernel step over a row block is one contiguous run of
  memory however narrow the step is. N is padded with zero rows to a multiple of ``TILE_ROWS``;
  the padding never reaches an output (stores are masked by the true N, which the scale's length
  gives).

The layout is chosen once, when the head is quantised, by ``int8_kernel.preferred_layout``.
"""

from __future__ import annotations

import torch

__all__ = [
    "PERM_CHUNK",
    "ROWS",
    "TILE_ROWS",
    "WGMMA",
    "logical_columns",
    "pack",
    "packed_rows",
    "row_block",
    "unpack",
]

ROWS = "rows"
WGMMA = "wgmma"
LAYOUTS = (ROWS, WGMMA)
PERM_CHUNK = 64  # K is permuted inside chunks of this many columns
TILE_ROWS = 128  # rows per tile (and per program of the kernels that read the layout)


def _check(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown int8 weight layout {layout!r}; allowed: {', '.join(LAYOUTS)}")


def packed_rows(n: int, layout: str) -> int:
    """Rows of the stored tensor for a head of ``n`` rows."""
    _check(layout)
    return n if layout == ROWS else -(-n // TILE_ROWS) * TILE_ROWS


def pack(q: torch.Tensor, layout: str) -> torch.Tensor:
    """``q`` (int8, ``(N, K)`` row-major) in ``layout``; a new tensor unless the layout is rows."""
    _check(layout)
    if layout == ROWS:
        return q
    n, k = q.shape
    if k % PERM_CHUNK:
        raise ValueError(f"the wgmma layout needs K to be a multiple of {PERM_CHUNK}, got K={k}")
    n_pad = packed_rows(n, layout)
    out = torch.empty((n_pad, k), dtype=q.dtype, device=q.device)
    # one row block at a time: never more than one block's extra copy
    for r0 in range(0, n_pad, TILE_ROWS):
        block = q[r0 : min(n, r0 + TILE_ROWS)]
        if block.shape[0] < TILE_ROWS:
            block = torch.cat([block, block.new_zeros((TILE_ROWS - block.shape[0], k))])
        out[r0 : r0 + TILE_ROWS] = _tile_block(block)
    return out


def _tile_block(block: torch.Tensor) -> torch.Tensor:
    """One ``(TILE_ROWS, K)`` row block -> its memory in the wgmma layout, as ``(TILE_ROWS, K)``."""
    r, k = block.shape
    c = k // PERM_CHUNK
    # logical k = 64c + 16j + 8eh + 2t + el -> stored (c, t, j, eh, el), tiles [c][row][64]
    perm = block.reshape(r, c, 4, 2, 4, 2).permute(1, 0, 4, 2, 3, 5)
    return perm.contiguous().reshape(r, k)


def row_block(w: torch.Tensor, r0: int, r1: int, layout: str) -> torch.Tensor:
    """Logical rows ``r0:r1`` of a packed weight as ``(r1 - r0, K)``, K in *stored* order
    (multiply by ``x[:, logical_columns(K)]``). For ``wgmma``, ``r0`` and ``r1`` must be multiples
    of ``TILE_ROWS`` (or ``r1`` the padded end)."""
    _check(layout)
    if layout == ROWS:
        return w[r0:r1]
    if r0 % TILE_ROWS or r1 % TILE_ROWS:
        raise ValueError(f"row range {r0}:{r1} is not aligned to {TILE_ROWS}-row tiles")
    n = r1 - r0
    k = w.shape[1]
    tiles = w[r0:r1].reshape(n // TILE_ROWS, k // PERM_CHUNK, TILE_ROWS, PERM_CHUNK)
    return tiles.permute(0, 2, 1, 3).reshape(n, k)


def logical_columns(k: int, layout: str, device: torch.device | None = None) -> torch.Tensor:
    """For every stored column, the logical column it holds (an index into x's last dim)."""
    _check(layout)
    idx = torch.arange(k, device=device)
    if layout == ROWS:
        return idx
    p = idx % PERM_CHUNK
    t, j, eh, el = p // 16, (p // 4) % 4, (p // 2) % 2, p % 2
    return idx - p + 16 * j + 8 * eh + 2 * t + el


def unpack(w: torch.Tensor, n: int, layout: str) -> torch.Tensor:
    """The logical ``(n, K)`` row-major int8 weight of a packed one (a full copy: tests only)."""
    _check(layout)
    if layout == ROWS:
        return w[:n]
    k = w.shape[1]
    rows = row_block(w, 0, w.shape[0], layout)
    logical = torch.empty_like(rows)
    logical[:, logical_columns(k, layout, w.device)] = rows
    return logical[:n].contiguous()
