"""Weight-only int8 lm-head: int8 weights, one fp32 scale per output row, bf16/fp16 activations.

``quantize_rows_int8`` turns a ``(N, K)`` weight into ``(q, scale)`` with
``w ~= q * scale[:, None]``; ``int8_linear`` computes ``x @ (q * scale[:, None]).T (+ bias)``
without ever building the dequantised weight.

On CUDA with Triton the product runs in one kernel that streams the int8 weight once, converts
each tile to bf16 (or fp16) in registers and feeds it to the tensor cores; the per-row scale and
the bias are applied to the fp32 accumulator at the end. Kinds (``KernelConfig.kind``):

- every CUDA GPU, the Spark's GB10 included (weight in ``layout.ROWS``): ``"mmab"``, Triton's
  ``x @ W.T`` with the weight as the dot's right operand; ``"gluon"`` (up to 64 rows), the
  explicit-layout Gluon ``mma.sync`` kernel of ``int8_gluon``;
- Hopper (sm_90) only (weight in ``layout.WGMMA``): ``"wgmma"``, the kernel of ``int8_wgmma``,
  and ``"mmab"`` reading the tiled layout.

Launch configurations come from tables indexed by M: the built-in ``CONFIG_TABLE`` (rows) and
``WGMMA_TABLE`` (wgmma), or the table ``calibrate`` measured on the GPU at load
(``int8_linear(..., table=...)``). Nothing is tuned and nothing is synchronised with the host
during a call. Besides the output, the only allocations are a gathered copy of x when Triton
reads the ``wgmma`` layout and a copy of an x whose address TMA cannot use (not 16-byte aligned),
so the call can be captured in a CUDA graph (after one warm-up call has compiled the kernel).
Variants that no table can choose live in ``benchmarks/`` (``lmhead_variants.py``).

Everything else (CPU tensors, fp32 activations, no Triton) takes a torch path that dequantises the
weight in row chunks, so it never holds more than ``chunk_bytes`` of fp32 weight at once.
"""

# Triton types the kernels' parameters (pointers, ints, constexprs); annotations would not help.
# ruff: noqa: ANN001, ANN202

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from . import layout
from .launch import launch_rows_kernel

try:  # Triton is optional: the torch path covers machines without it.
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the environment
    triton = None
    tl = None
    HAS_TRITON = False

__all__ = [
    "CONFIG_TABLE",
    "HAS_TRITON",
    "KernelConfig",
    "Table",
    "built_in_table",
    "dequantize_rows_int8",
    "fewer_stages",
    "gluon_config",
    "int8_linear",
    "launch_constexprs",
    "preferred_layout",
    "quantize_rows_int8",
    "select_config",
    "wgmma_config",
]

_DEFAULT_CHUNK_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """One launch configuration of a kernel.

    ``kind`` is ``"mmab"`` (Triton, ``x @ W.T``), ``"gluon"`` or ``"wgmma"`` (module docstring).
    ``block_m`` rows of x, ``block_n`` weight rows and ``block_k`` columns per step are handled by
    one program; ``num_warps`` and ``num_stages`` are passed to Triton. ``split_m`` (``mmab``, 1
    to 4) gives each program that many blocks of ``block_m`` rows, all multiplied with one
    converted weight tile (M up to 64 as up to four 16-row ``mma.sync`` dots).
    ``kind="gluon"`` runs the explicit-layout Gluon kernel of ``int8_gluon`` (``out.T = W @ x.T``
    with ``mma.sync``; weight and x tiles through a ``cp.async`` ring in shared memory, the weight
    converted once in A-fragment registers for all x columns); it uses ``block_n``, ``block_k``,
    ``num_warps``, ``k_width``, ``num_stages`` (the ring's depth; ``K / block_k`` must be a multiple
    of it), ``k_slice`` (columns of a step read into registers at a time), ``warps_m`` (warps
    splitting the x columns) and ``split_cols`` (M as two accumulators, a power of two plus 8 or
    16, e.g. 39 as 32 + 8). ``block_m`` is unused (M <= 64 only). Where Gluon is missing or the
    shape does not fit, the call falls back to ``GLUON_FALLBACK`` (Triton).
    ``kind="wgmma"`` (Hopper, weights in the ``wgmma`` layout only) runs ``int8_wgmma``'s kernel:
    ``num_stages`` weight-ring and ``x_stages`` x-ring slots (0: as many) of ``chunks`` x 64 K
    columns, ``split_cols`` (33 to 48 rows as 32 + 8 or 32 + 16 columns), and ``stagger`` (each
    program starts its walk over K at a different step).
    """

    kind: str
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_m: int = 1
    k_width: int = 8
    k_slice: int = 32
    warps_m: int = 1
    split_cols: bool = False
    chunks: int = 1
    stagger: bool = False
    x_stages: int = 0

    @property
    def rows_per_program(self) -> int:
        return self.block_m * self.split_m


# A table: (largest M, config) rows; the first entry whose bound is >= M is used; the last one
# serves any larger M (its grid covers M in blocks of block_m).
Table = tuple[tuple[int, "KernelConfig"], ...]

# The built-in tables; `calibrate` replaces entries with what it measures faster on the GPU at
# hand, one row range (group) at a time. A range ends where the kernels' shapes change (the Gluon
# and wgmma kernels run 33-40 rows as 32 + 8 columns, 41-48 as 32 + 16), so that one timing
# stands for the whole range. Chosen on an H200 with benchmarks/lmhead_bench.py --sweep [--gluon]
# at N=248320, K=3072 (see benchmarks/NOTES-lmhead.md). 33..48 rows: the Gluon kernel, 0.268 ms
# against 0.287 for the Triton 16-row split 3 at M=39 in one call (a tie at M=48).
_GLUON_33_48 = KernelConfig("gluon", 0, 128, 128, 4, 3, k_slice=128, split_cols=True)
CONFIG_TABLE: Table = (
    (16, KernelConfig("mmab", 16, 128, 256, 4, 3)),
    (32, KernelConfig("mmab", 16, 128, 128, 4, 4, split_m=2)),
    (40, _GLUON_33_48),
    (48, _GLUON_33_48),
    (1 << 62, KernelConfig("mmab", 64, 128, 128, 4, 3)),
)


# Used for a "gluon" entry where the Gluon kernel cannot run (no Gluon, K not a multiple of
# block_k, M > 64): the Triton mmab kernel.
GLUON_FALLBACK: Table = (
    (16, KernelConfig("mmab", 16, 128, 256, 4, 3)),
    (32, KernelConfig("mmab", 16, 128, 128, 4, 4, split_m=2)),
    (48, KernelConfig("mmab", 16, 128, 128, 4, 3, split_m=3)),
    (1 << 62, KernelConfig("mmab", 64, 128, 128, 4, 3)),
)


# --- Hopper (sm_90) only: a GB10 never stores the wgmma layout ---------------------------------
# The same for a weight in the ``wgmma`` layout: the wgmma kernel up to 64 rows (two
# 64-column chunks per step and two ring slots up to 16 rows, three slots above; programs start
# at staggered K offsets up to 32 rows); Triton's 64-row blocks beyond. Chosen on an H200 by
# benchmarks/lmhead_bench.py --sweep-wgmma; its measurements: benchmarks/NOTES-lmhead.md.
_WGMMA_33_64 = KernelConfig("wgmma", 0, 128, 64, 4, 3, split_cols=True)
WGMMA_TABLE: Table = (
    (16, KernelConfig("wgmma", 0, 128, 64, 4, 2, split_cols=True, chunks=2, stagger=True)),
    (32, KernelConfig("wgmma", 0, 128, 64, 4, 3, split_cols=True, stagger=True)),
    (40, _WGMMA_33_64),
    (48, _WGMMA_33_64),
    (64, _WGMMA_33_64),
    (1 << 62, KernelConfig("mmab", 64, 128, 128, 4, 3)),
)

# Used for a "wgmma" entry where that kernel cannot run (no Gluon, a shape that does not fit):
# the Triton mmab kernel over the same layout, with the Gluon fallback's configurations (their
# 128-row blocks and 64-column multiples read the tiled layout as they are).
WGMMA_FALLBACK = GLUON_FALLBACK


def built_in_table(weight_layout: str = layout.ROWS) -> Table:
    """The table shipped for a weight in ``weight_layout``."""
    return WGMMA_TABLE if weight_layout == layout.WGMMA else CONFIG_TABLE


def select_config(
    m: int, weight_layout: str = layout.ROWS, table: Table | None = None
) -> KernelConfig:
    """``table``'s configuration (default: the built-in one for ``weight_layout``) for ``m`` rows
    of activations."""
    table = table or built_in_table(weight_layout)
    for bound, cfg in table:
        if m <= bound:
            return cfg
    return table[-1][1]


def quantize_rows_int8(
    weight: torch.Tensor, *, chunk_bytes: int = _DEFAULT_CHUNK_BYTES
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-row int8 quantisation of a ``(N, K)`` weight.

    Returns ``(q, scale)``: ``q`` int8 ``(N, K)`` in [-127, 127], ``scale`` fp32 ``(N,)`` equal to
    the row's absolute maximum / 127, so that ``q * scale[:, None]`` approximates ``weight``. An
    all-zero row gets scale 0 and q 0. Rows are processed in chunks of at most ``chunk_bytes`` of
    fp32, so a 1.4 GiB bf16 weight on a GPU needs only one small fp32 buffer besides the result.
    """
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (N, K), got shape {tuple(weight.shape)}")
    if weight.is_complex() or not weight.is_floating_point():
        raise TypeError(f"weight must be a real floating-point tensor, got {weight.dtype}")
    n, k = weight.shape
    q = torch.empty((n, k), dtype=torch.int8, device=weight.device)
    scale = torch.zeros((n,), dtype=torch.float32, device=weight.device)
    if n == 0 or k == 0:
        q.zero_()
        return q, scale
    rows = max(1, chunk_bytes // (k * 4))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        w = weight[r0:r1].to(torch.float32, copy=True)  # the only fp32 buffer: (rows, K)
        absmax = w.abs().amax(dim=1)
        inv = torch.where(absmax > 0, 127.0 / absmax, torch.zeros_like(absmax))
        w.mul_(inv[:, None]).round_().clamp_(-127.0, 127.0)
        q[r0:r1].copy_(w)
        scale[r0:r1] = absmax / 127.0
    return q, scale


def dequantize_rows_int8(
    w_int8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``w_int8 * scale[:, None]`` in ``dtype`` (a full copy: for tests and references only)."""
    return (w_int8.to(torch.float64) * scale.to(torch.float64)[:, None]).to(dtype)


def _check_args(
    x: torch.Tensor,
    w_int8: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    weight_layout: str,
) -> tuple[int, int]:
    if w_int8.dtype != torch.int8 or w_int8.dim() != 2:
        raise TypeError(
            f"w_int8 must be a 2-D int8 tensor, got {w_int8.dtype} {tuple(w_int8.shape)}"
        )
    if scale.dim() != 1:
        raise ValueError(f"scale must be 1-D (N,), got shape {tuple(scale.shape)}")
    n, k = scale.shape[0], w_int8.shape[1]
    rows = layout.packed_rows(n, weight_layout)
    if w_int8.shape[0] != rows:
        raise ValueError(
            f"scale has {n} rows, so a {weight_layout!r} weight must have {rows} rows,"
            f" got shape {tuple(w_int8.shape)}"
        )
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"x's last dimension must be K={k}, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be floating point, got {x.dtype}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
    return n, k


def int8_linear(
    x: torch.Tensor,
    w_int8: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    config: KernelConfig | None = None,
    weight_layout: str = layout.ROWS,
    table: Table | None = None,
) -> torch.Tensor:
    """``x @ (w_int8 * scale[:, None]).T + bias``, dtype ``x.dtype``, shape ``(..., N)``.

    ``w_int8`` is stored in ``weight_layout`` (``layout.pack``); N is ``scale``'s length.

    ``out`` (optional) is a ``(M, N)`` tensor of ``x.dtype`` whose last dimension is contiguous,
    with M the number of rows of ``x`` flattened; it is written and returned reshaped to
    ``(..., N)``.
    ``table`` is the launch table (default: the built-in one for the layout; the plugin passes
    the calibrated one); ``config`` overrides any table (calibration and benchmarks).
    """
    n, k = _check_args(x, w_int8, scale, bias, weight_layout)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.dtype != x.dtype or (n > 1 and out.stride(1) != 1):
        raise ValueError("out must be (M, N) of x.dtype with a contiguous last dimension")
    if m > 0 and n > 0:
        if _use_triton(x2, w_int8):
            cfg = config or select_config(m, weight_layout, table)
            _triton_int8_linear(x2, w_int8, scale, bias, out, cfg, weight_layout)
        else:
            _torch_int8_linear(x2, w_int8, scale, bias, out, weight_layout)
    return out.reshape(*lead, n)


def _use_triton(x2: torch.Tensor, w_int8: torch.Tensor) -> bool:
    return (
        HAS_TRITON
        and x2.is_cuda
        and w_int8.device == x2.device
        and x2.dtype in (torch.bfloat16, torch.float16)
        and x2.shape[1] > 0
    )


def _torch_int8_linear(
    x2: torch.Tensor,
    w_int8: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    weight_layout: str = layout.ROWS,
    *,
    chunk_bytes: int = _DEFAULT_CHUNK_BYTES // 2,
) -> None:
    """fp32 product over chunks of weight rows, then scale and bias, then cast to out's dtype.
    x is taken in the layout's stored column order, so the weight is never reordered along K."""
    n, k = scale.shape[0], w_int8.shape[1]
    xf = x2.to(device=w_int8.device, dtype=torch.float32)
    if weight_layout != layout.ROWS:
        xf = xf[:, layout.logical_columns(k, weight_layout, xf.device)]
    rows = max(1, chunk_bytes // max(1, k * 4))
    if weight_layout != layout.ROWS:  # whole tiles of rows
        rows = max(layout.TILE_ROWS, rows // layout.TILE_ROWS * layout.TILE_ROWS)
    packed = w_int8.shape[0]
    for n0 in range(0, n, rows):
        n1 = min(n, n0 + rows)
        block = layout.row_block(w_int8, n0, min(packed, n0 + rows), weight_layout)[: n1 - n0]
        y = xf @ block.to(torch.float32).T
        y.mul_(scale[n0:n1].to(device=y.device, dtype=torch.float32))
        if bias is not None:
            y.add_(bias[n0:n1].to(device=y.device, dtype=torch.float32))
        out[:, n0:n1] = y


_STORED_ORDER: dict[tuple[int, torch.device], torch.Tensor] = {}


def _stored_order(k: int, device: torch.device) -> torch.Tensor:
    """``layout.logical_columns`` for the wgmma layout, made once per K and device (so that no
    allocation happens inside a CUDA-graph capture after the warm-up call)."""
    key = (k, device)
    if key not in _STORED_ORDER:
        _STORED_ORDER[key] = layout.logical_columns(k, layout.WGMMA, device)
    return _STORED_ORDER[key]


_FAILED: set[str] = set()  # experimental kernels that failed once: the fallback from then on


def _kernel_failed(kind: str, error: Exception) -> None:
    """Use the Triton fallback from now on; the first failure (a compile error in a Triton whose
    experimental Gluon API differs, say) happens at warm-up, before any CUDA-graph capture."""
    _FAILED.add(kind)
    logging.getLogger("vllm.sparkserve.lmhead").warning(
        "sparkserve int8 lm-head: the %s kernel failed (%s: %s); using the Triton kernel",
        kind,
        type(error).__name__,
        str(error).splitlines()[0] if str(error) else "",
    )


def _triton_int8_linear(
    x2: torch.Tensor,
    w_int8: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    cfg: KernelConfig,
    weight_layout: str = layout.ROWS,
) -> Any:
    assert triton is not None
    m, k = x2.shape
    n = scale.shape[0]
    tiled = weight_layout == layout.WGMMA
    if cfg.kind == "wgmma":
        if not tiled:
            raise ValueError("the wgmma kernel needs a weight in the 'wgmma' layout")
        from . import int8_wgmma

        wcfg = int8_wgmma.fit_config(x2, k, wgmma_config(cfg))
        if "wgmma" not in _FAILED and wcfg is not None:
            try:
                return int8_wgmma.wgmma_int8_linear(x2, w_int8, scale, bias, out, wcfg)
            except Exception as error:  # Gluon is experimental: serve with Triton instead
                _kernel_failed("wgmma", error)
        cfg = next(c for b, c in WGMMA_FALLBACK if m <= b)
    if cfg.kind == "gluon":
        from . import int8_gluon

        gcfg = gluon_config(cfg)
        if "gluon" not in _FAILED and not tiled and int8_gluon.gluon_supported(x2, w_int8, gcfg):
            try:
                return int8_gluon.gluon_int8_linear(x2, w_int8, scale, bias, out, gcfg)
            except Exception as error:  # Gluon is experimental: serve with Triton instead
                _kernel_failed("gluon", error)
        cfg = next(c for b, c in GLUON_FALLBACK if m <= b)
    if tiled and (cfg.kind != "mmab" or cfg.block_n != layout.TILE_ROWS or cfg.block_k % 64):
        raise ValueError(f"{cfg} cannot read a weight in the 'wgmma' layout")
    if tiled:  # the mmab kernel reads x in the weight's stored column order: one small gather
        x2 = x2.index_select(1, _stored_order(k, x2.device))
    grid = (triton.cdiv(m, cfg.rows_per_program) * triton.cdiv(n, cfg.block_n),)
    if cfg.kind != "mmab":
        raise ValueError(f"unknown kernel kind {cfg.kind!r}; allowed: mmab, gluon, wgmma")
    constexprs = launch_constexprs(cfg, k, bias is not None, tiled)
    return _launch_fitted(
        _int8_mmab_kernel, grid, x2, w_int8, scale, bias, out, m, n, k, cfg, constexprs
    )


def preferred_layout(device: torch.device) -> str:
    """``wgmma`` on an sm_90 GPU whose Triton has Gluon's Hopper module, else ``rows``."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return layout.ROWS
    if torch.cuda.get_device_capability(device) != (9, 0):
        return layout.ROWS  # wgmma is sm_90a only; GB10 (sm_121) and Ampere use mma.sync
    from . import int8_wgmma

    return layout.WGMMA if int8_wgmma.HAS_WGMMA else layout.ROWS


def wgmma_config(cfg: KernelConfig) -> Any:
    """The ``int8_wgmma.WgmmaConfig`` of a ``kind="wgmma"`` entry."""
    from . import int8_wgmma

    return int8_wgmma.WgmmaConfig(
        cfg.num_stages, cfg.chunks, cfg.split_cols, cfg.stagger, cfg.x_stages
    )


def gluon_config(cfg: KernelConfig) -> Any:
    """The ``int8_gluon.GluonConfig`` of a ``kind="gluon"`` entry."""
    from . import int8_gluon

    return int8_gluon.GluonConfig(
        cfg.block_n, cfg.block_k, cfg.num_warps, cfg.k_width, cfg.num_stages, cfg.k_slice,
        cfg.warps_m, cfg.split_cols,
    )  # fmt: skip


def launch_constexprs(cfg: KernelConfig, k: int, has_bias: bool, tiled: bool) -> dict[str, Any]:
    """The Triton kernel's compile-time arguments (also used to compile it without a GPU in the
    tests); ``tiled``: the weight is in the wgmma layout."""
    return {
        "HAS_BIAS": has_bias,
        "EVEN_K": k % cfg.block_k == 0,
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "BLOCK_K": cfg.block_k,
        "SPLIT_M": cfg.split_m,
        "TILED": tiled,
    }


def fewer_stages(cfg: KernelConfig) -> KernelConfig | None:
    """``cfg`` one pipeline stage shallower (less shared memory), or None at two stages. The
    tables were tuned on an H200 (227 KiB of shared memory per block); sm_12x parts such as the
    Spark's GB10 allow 99 KiB, where the 17-32-row entry's four stages (104 KiB) do not fit."""
    return dataclasses.replace(cfg, num_stages=cfg.num_stages - 1) if cfg.num_stages > 2 else None


# (config, device index) -> the config that fits that device's shared memory
_FITTED: dict[tuple[KernelConfig, int], KernelConfig] = {}


def _launch_fitted(kernel, grid, x2, w_int8, scale, bias, out, m, n, k, cfg, constexprs):
    """``_launch``, with as many stages of ``cfg`` as the device's shared memory holds: Triton
    raises OutOfResources before running anything, so a shallower retry is safe (vLLM computes
    the logits outside its CUDA graphs, so this also holds for the first call of a new M)."""
    key = (cfg, x2.device.index or 0)
    fitted = _FITTED.get(key, cfg)
    while True:
        try:
            result = _launch(
                kernel, grid, x2, w_int8, scale, bias, out, m, n, k, fitted, constexprs
            )
        except triton.runtime.errors.OutOfResources as error:
            shallower = fewer_stages(fitted)
            if shallower is None:
                raise
            logging.getLogger("vllm.sparkserve.lmhead").info(
                "sparkserve int8 lm-head: %s stages do not fit this GPU (%s); trying %s",
                fitted.num_stages,
                str(error).splitlines()[0],
                shallower.num_stages,
            )
            fitted = shallower
            continue
        _FITTED[key] = fitted
        return result


def _launch(kernel, grid, x2, w_int8, scale, bias, out, m, n, k, cfg, constexprs):
    return launch_rows_kernel(
        kernel, grid, x2, w_int8, scale, bias, out, m, n, k, cfg.num_warps,
        num_stages=cfg.num_stages, **constexprs,
    )  # fmt: skip


if HAS_TRITON:

    @triton.jit(do_not_specialize=["M"])
    def _int8_mmab_kernel(
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
        SPLIT_M: tl.constexpr,
        TILED: tl.constexpr = False,
    ):
        # acc_j[BLOCK_M, BLOCK_N] = x[m-block j, :] @ W[n-block, :].T for j < SPLIT_M; the weight
        # tile is the dot's right operand, loaded and converted once per step for all j.
        pid = tl.program_id(0)
        num_pid_m = tl.cdiv(M, BLOCK_M * SPLIT_M)
        pid_m = pid % num_pid_m
        pid_n = pid // num_pid_m
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = pid_m * (BLOCK_M * SPLIT_M) + tl.arange(0, BLOCK_M)
        offs_k = tl.arange(0, BLOCK_K)
        rows_n = tl.minimum(offs_n, N - 1).to(tl.int64)
        if TILED:
            # layout.WGMMA: [BLOCK_N, 64] tiles (BLOCK_N = the tile height), K permuted inside
            # each 64-column tile; x is read at the logical column each stored column holds
            w_ptrs = (
                w_ptr
                + pid_n.to(tl.int64) * BLOCK_N * K
                + (offs_k // 64)[:, None] * (BLOCK_N * 64)
                + tl.arange(0, BLOCK_N)[None, :] * 64
                + (offs_k % 64)[:, None]
            )
            W_STEP: tl.constexpr = BLOCK_K * BLOCK_N
        else:
            w_ptrs = w_ptr + rows_n[None, :] * stride_wn + offs_k[:, None]  # [BLOCK_K, BLOCK_N]
            W_STEP: tl.constexpr = BLOCK_K
        # for TILED, the caller passes x with its columns in the weight's stored order
        x0 = x_ptr + tl.minimum(offs_m, M - 1).to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
        x1 = x_ptr + tl.minimum(offs_m + BLOCK_M, M - 1).to(tl.int64)[:, None] * stride_xm
        x2 = x_ptr + tl.minimum(offs_m + 2 * BLOCK_M, M - 1).to(tl.int64)[:, None] * stride_xm
        x3 = x_ptr + tl.minimum(offs_m + 3 * BLOCK_M, M - 1).to(tl.int64)[:, None] * stride_xm
        x1 += offs_k[None, :]
        x2 += offs_k[None, :]
        x3 += offs_k[None, :]
        cdtype = x_ptr.dtype.element_ty
        acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc3 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = offs_k < K - k0
            if EVEN_K:  # noqa: SIM108 (Triton)
                wq = tl.load(w_ptrs)
            else:
                wq = tl.load(w_ptrs, mask=k_ok[:, None], other=0)
            if EVEN_K:
                wb = wq.to(cdtype)
                acc0 = tl.dot(tl.load(x0), wb, acc0)
                if SPLIT_M >= 2:
                    acc1 = tl.dot(tl.load(x1), wb, acc1)
                if SPLIT_M >= 3:
                    acc2 = tl.dot(tl.load(x2), wb, acc2)
                if SPLIT_M >= 4:
                    acc3 = tl.dot(tl.load(x3), wb, acc3)
            else:
                wb = wq.to(cdtype)
                acc0 = tl.dot(tl.load(x0, mask=k_ok[None, :], other=0.0), wb, acc0)
                if SPLIT_M >= 2:
                    acc1 = tl.dot(tl.load(x1, mask=k_ok[None, :], other=0.0), wb, acc1)
                if SPLIT_M >= 3:
                    acc2 = tl.dot(tl.load(x2, mask=k_ok[None, :], other=0.0), wb, acc2)
                if SPLIT_M >= 4:
                    acc3 = tl.dot(tl.load(x3, mask=k_ok[None, :], other=0.0), wb, acc3)
            w_ptrs += W_STEP
            x0 += BLOCK_K
            x1 += BLOCK_K
            x2 += BLOCK_K
            x3 += BLOCK_K
        s = tl.load(s_ptr + rows_n).to(tl.float32)
        if HAS_BIAS:
            b = tl.load(b_ptr + rows_n).to(tl.float32)
        else:
            b = tl.zeros((BLOCK_N,), dtype=tl.float32)
        n_ok = offs_n[None, :] < N
        o_ptrs = o_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        out_ty = o_ptr.dtype.element_ty
        y0 = acc0 * s[None, :] + b[None, :]
        tl.store(o_ptrs, y0.to(out_ty), mask=(offs_m[:, None] < M) & n_ok)
        if SPLIT_M >= 2:
            y1 = acc1 * s[None, :] + b[None, :]
            m_ok = offs_m[:, None] + BLOCK_M < M
            tl.store(o_ptrs + BLOCK_M * stride_om, y1.to(out_ty), mask=m_ok & n_ok)
        if SPLIT_M >= 3:
            y2 = acc2 * s[None, :] + b[None, :]
            m_ok = offs_m[:, None] + 2 * BLOCK_M < M
            tl.store(o_ptrs + 2 * BLOCK_M * stride_om, y2.to(out_ty), mask=m_ok & n_ok)
        if SPLIT_M >= 4:
            y3 = acc3 * s[None, :] + b[None, :]
            m_ok = offs_m[:, None] + 3 * BLOCK_M < M
            tl.store(o_ptrs + 3 * BLOCK_M * stride_om, y3.to(out_ty), mask=m_ok & n_ok)
