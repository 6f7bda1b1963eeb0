"""Compile the int8 lm-head kernels for a GPU without having one: Triton's own compiler, the
target named (``python -m sparkserve.in_vllm.lmhead.compile_check --arch 121``).

A Triton release can rename what a kernel calls (Gluon's ``thread_barrier`` became ``barrier`` in
3.7); the plugin then logs the failure at its first call and serves with a slower kernel.
Compiling every configuration of the kernel tables ahead of time, for the Spark (sm_121, the
``rows`` weight layout) and for the H200 the benchmarks run on (sm_90a, the ``wgmma`` layout),
turns that into an error before anyone serves. Needs Triton with its NVIDIA backend (ptxas ships
in Triton's wheel), no GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from . import int8_gluon, int8_kernel, int8_wgmma, layout
from .layout import PERM_CHUNK, TILE_ROWS

__all__ = ["Compiled", "compile_all", "jobs", "main", "uses_tensor_cores"]

ARCHS = (121, 90)  # the Spark; the H200 of the benchmarks
# shared memory one block may use (CUDA C++ Programming Guide, "Technical Specifications per
# Compute Capability": 99 KB for 12.x, 227 KB for 9.0)
SHARED_LIMIT = {121: 99 * 1024, 90: 227 * 1024}
MS = (1, 13, 26, 39, 64, 100)  # decode, one DFlash verify, 2 and 3 streams, the largest table row

# the tensor-core instructions each kernel's PTX must contain one of (Triton's dot picks wgmma
# on sm_90 where the tile allows)
EXPECTED_PTX = {
    "triton": ("mma.sync", "wgmma.mma_async"),
    "gluon": ("mma.sync",),
    "wgmma": ("wgmma.mma_async",),
}


def uses_tensor_cores(c: Compiled) -> bool:
    return any(ins in c.ptx for ins in EXPECTED_PTX[c.kernel])


# the runtime arguments of the Triton and the Gluon mma kernels, as the launchers pass them
# (bf16 activations and output; no bias, so the bias pointer is the fp32 scale)
_ARG_TYPES = {
    "x_ptr": "*bf16",
    "w_ptr": "*i8",
    "s_ptr": "*fp32",
    "b_ptr": "*fp32",
    "o_ptr": "*bf16",
    **dict.fromkeys(("M", "N", "K", "stride_xm", "stride_wn", "stride_om"), "i32"),
}


@dataclasses.dataclass(frozen=True)
class Compiled:
    kernel: str  # "triton", "gluon" or "wgmma"
    m: int
    arch: int
    ptx: str
    shared_bytes: int
    stages: int  # the pipeline depth that fits SHARED_LIMIT (the dispatch drops stages alike)

    @property
    def fits(self) -> bool:
        return self.shared_bytes <= SHARED_LIMIT[self.arch]


@dataclasses.dataclass(frozen=True)
class _Job:
    kernel: str
    m: int
    cfg: int8_kernel.KernelConfig


def jobs(arch: int) -> list[_Job]:
    """One compile per (kernel, M) the dispatch would run for ``arch``'s weight layout."""
    lay = layout.WGMMA if arch == 90 else layout.ROWS
    out = []
    for m in MS:
        cfg = int8_kernel.select_config(m, lay)
        if cfg.kind == "wgmma":
            out.append(_Job("wgmma", m, cfg))
        elif cfg.kind == "gluon":
            out.append(_Job("gluon", m, cfg))
            # and the Triton kernel it falls back to
            out.append(_Job("triton", m, next(c for b, c in int8_kernel.GLUON_FALLBACK if m <= b)))
        else:
            out.append(_Job("triton", m, cfg))
    return out


def _pointer_signature(fn: Any) -> dict[str, str]:
    return {name: _ARG_TYPES[name] for name in fn.arg_names if name in _ARG_TYPES}


def _source(job: _Job, n: int, k: int, tiled: bool) -> tuple[Any, dict[str, Any]]:
    import triton
    from triton.experimental.gluon._runtime import GluonASTSource

    cfg = job.cfg
    if job.kernel == "wgmma":
        wcfg = int8_wgmma._fit(job.m, k, int8_kernel.wgmma_config(cfg))
        assert wcfg is not None, f"the wgmma kernel does not fit M={job.m} K={k}"
        cst = int8_wgmma.launch_constexprs(job.m, k, wcfg, has_bias=False)
        bm, bm2 = cst["BLOCK_M"], cst["BLOCK_M2"]
        xl, wl = int8_wgmma.x_smem_layout(), int8_wgmma.w_smem_layout()
        fn = int8_wgmma._int8_wgmma_kernel
        sig = {
            "x_desc": f"tensordesc<bf16[{bm}, {PERM_CHUNK}],{xl!r}>",
            "x2_desc": f"tensordesc<bf16[{bm2 or bm}, {PERM_CHUNK}],{xl!r}>",
            "w_desc": f"tensordesc<i8[{TILE_ROWS}, {PERM_CHUNK}],{wl!r}>",
            "s_ptr": "*fp32",
            "b_ptr": "*fp32",
            "o_ptr": "*bf16",
            "M": "i32",
            "N": "i32",
            "stride_om": "i32",
        }
        src = GluonASTSource(
            fn, {**sig, **dict.fromkeys(cst, "constexpr")}, cst, _aligned(fn, job.m, n, k)
        )
        return src, {"num_warps": 4}
    if job.kernel == "gluon":
        cst = int8_gluon.launch_constexprs(job.m, int8_kernel.gluon_config(cfg), has_bias=False)
        fn = int8_gluon._int8_gluon_kernel
        sig = {**_pointer_signature(fn), **dict.fromkeys(cst, "constexpr")}
        return GluonASTSource(fn, sig, cst, _aligned(fn, job.m, n, k)), {"num_warps": cfg.num_warps}
    cst = int8_kernel.launch_constexprs(cfg, k, has_bias=False, tiled=tiled)
    fn = int8_kernel._int8_mmab_kernel
    sig = {**_pointer_signature(fn), **dict.fromkeys(cst, "constexpr")}
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return triton.compiler.ASTSource(fn, sig, cst, _aligned(fn, job.m, n, k)), options


def _aligned(fn: Any, m: int, n: int, k: int) -> dict[tuple[int, ...], list[list[Any]]]:
    """What Triton assumes at a launch of the main shape: 16-byte aligned pointers, and integer
    arguments that are multiples of 16 (unless the kernel opts out, as for M) marked so."""
    values = {"M": m, "N": n, "K": k, "stride_xm": k, "stride_wn": k, "stride_om": n}
    skip = set(getattr(fn, "do_not_specialize", ()) or ())
    attrs = {}
    for i, name in enumerate(fn.arg_names):
        multiple = name in values and name not in skip and values[name] % 16 == 0
        if name.endswith("_ptr") or multiple:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return attrs


def compile_all(arch: int, n: int = 248320, k: int = 3072, progress: Any = None) -> list[Compiled]:
    """Compile every job for ``arch`` (121 or 90) at an N x K head; raises what Triton raises."""
    import triton
    from triton.backends.compiler import GPUTarget

    if arch not in ARCHS:
        raise ValueError(f"arch {arch} is not one of {ARCHS}")
    done = []
    for job in jobs(arch):
        while True:
            src, options = _source(job, n, k, tiled=arch == 90)  # sm_90: the wgmma layout
            kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
            shallower = int8_kernel.fewer_stages(job.cfg) if job.kernel == "triton" else None
            if kernel.metadata.shared <= SHARED_LIMIT[arch] or shallower is None:
                break
            job = dataclasses.replace(job, cfg=shallower)  # as int8_kernel's launch does
        done.append(Compiled(
            job.kernel, job.m, arch, kernel.asm["ptx"], kernel.metadata.shared, job.cfg.num_stages
        ))  # fmt: skip
        if progress is not None:
            progress(done[-1])
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparkserve.in_vllm.lmhead.compile_check")
    ap.add_argument("--arch", type=int, choices=ARCHS, action="append",
                    help="compute capability x 10 (repeatable; default: all)")  # fmt: skip
    ap.add_argument("--n", type=int, default=248320, help="vocabulary rows of the head")
    ap.add_argument("--k", type=int, default=3072, help="hidden size (a multiple of 256)")
    args = ap.parse_args(argv)
    if args.k <= 0 or args.k % 256:
        print(f"compile_check: --k {args.k} is not a positive multiple of 256", file=sys.stderr)
        return 2
    if args.n <= 0:
        print(f"compile_check: --n {args.n} is not a positive row count", file=sys.stderr)
        return 2
    failed = 0
    for arch in args.arch or ARCHS:

        def show(c: Compiled) -> None:
            found = "ok" if uses_tensor_cores(c) else "no " + " / ".join(EXPECTED_PTX[c.kernel])
            room = "" if c.fits else f" over the {SHARED_LIMIT[c.arch]} B limit"
            print(f"sm_{c.arch} {c.kernel:6s} M={c.m:3d} stages {c.stages} "
                  f"shared {c.shared_bytes:6d} B{room} {found}")  # fmt: skip

        try:
            results = compile_all(arch, args.n, args.k, show)
        except Exception as error:  # report which Triton broke which kernel, in one line
            print(f"compile_check: sm_{arch}: {type(error).__name__}: {error}".splitlines()[0],
                  file=sys.stderr)  # fmt: skip
            failed += 1
            continue
        failed += sum(not (uses_tensor_cores(c) and c.fits) for c in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
