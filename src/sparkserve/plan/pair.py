"""`sparkserve plan --nodes 2`: one model across two Sparks, per node and across the pair.

The same definitions as one node's plan (docs/MEMORY.md), per node: GPU_MEM of each host's
memory is vLLM's share and OS_RESERVE_GB must stay outside it (memory/budget.py's rule);
each node's KV memory is its share less its weights (memory/sharding.py: vLLM's own sharding
for the layout), the int8 head's reclaim and the assumed overhead. vLLM lays the KV cache out
per node with its own classes (memory/kv.py) and takes the smaller node's block count; the
pool and the concurrency at MAX_MODEL_LEN are the pair's (each node holds its share of every
token's KV).

The decode ceiling is bandwidth-bound per stream, before speculation, plus the link's cost as
stated assumptions (--link-gbps, --link-latency-us), never a measurement. tp: both nodes read
their half at once; every token crosses the link once per collective (a broadcast of the
step to the worker, two all-reduces per layer, one after the embedding, one gather of the
head's logits). pp: the stages run one after the other for one stream; a token crosses the
link twice (the hand-over of hidden states and residual, the sampled token back to the head).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sparkserve.command_line import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    UsageError,
    fail,
)
from sparkserve.knobs.registry import KnobError
from sparkserve.memory.budget import largest_gpu_mem
from sparkserve.memory.checkpoint import CheckpointError
from sparkserve.memory.host import GIB
from sparkserve.memory.kv import GeometryError, KvGeometry, VllmMissing, kv_geometry_per_node
from sparkserve.memory.sharding import (
    Split,
    drafter_per_node,
    model_split,
    resolved_text_config,
)
from sparkserve.plan.single import (
    INT8_SCALE_BYTES,
    MachineMemory,
    Sources,
    active_bytes,
    assumption_rows,
    ceilings,
    input_value,
    kv_request,
    machine_memory,
    model_rows,
    plan_inputs,
    read_sources,
    with_verdict,
)

ACTIVATION_BYTES = 2  # bf16 activations and logits on the link
# vLLM 0.33 on Qwen3.5: its model runner V2 refuses a drafter that reads target layers across
# pipeline stages (v1/worker/gpu/spec_decode/eagle/eagle3_utils.py,
# verify_supports_aux_hidden_states_over_pp; tests/plan/test_plan_pair.py calls it on the model
# vLLM builds); the model does not pass them between stages.
DFLASH_PP_NOTE = (
    "vLLM 0.33 does not serve DFlash with pipeline parallelism on Qwen3.5: the drafter, on the "
    "last stage, reads target layers of both stages and the model does not hand them over "
    "(its model runner V2 refuses it); use --layout tp or --method mtp"
)


@dataclass
class NodePlan(MachineMemory):
    rank: int
    role: str  # "head" or "worker"
    layers: tuple[int, int]  # [first, end) of the decoder layers it runs
    kv: KvGeometry | None = None


@dataclass
class PairPlan:
    inputs: dict[str, Any]
    layout: str
    mem_total_bytes: int  # each node
    weights_bytes: int  # the whole checkpoint
    weights_source: str
    drafter_weights_bytes: int
    active_bytes: int | None
    active_source: str
    overhead_bytes: int  # each node
    largest_gpu_mem: float
    split: Split
    nodes: list[NodePlan]
    link: dict[str, float] = field(default_factory=dict)
    decode_ceiling: dict[str, float] = field(default_factory=dict)
    kv_error: str | None = None
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems and all(node.kv is not None for node in self.nodes)

    @property
    def pool(self) -> KvGeometry | None:
        return self.nodes[0].kv


def reclaim_per_node(split: Split) -> tuple[int, ...]:
    """What the int8 head gives back on each node: it converts the head rows a node holds
    (a padded vocabulary shard with tp, the whole head on the last stage with pp)."""
    if split.tied:
        return tuple(0 for _ in range(split.nodes))
    return tuple(rows * (split.hidden - INT8_SCALE_BYTES) for rows in split.head_rows)


def _node(
    args: argparse.Namespace,
    sources: Sources,
    rank: int,
    split: Split,
    loaded: tuple[int, int, int],
    active: int | None,
) -> tuple[NodePlan, str | None]:
    """One node's memory: loaded = (weights, drafter weights, reclaim) on it."""
    memory, problem = machine_memory(args, sources.settings, sources.total, loaded, active)
    role = "head" if rank == 0 else "worker"
    return NodePlan(**vars(memory), rank=rank, role=role, layers=split.layers[rank]), problem


def make_pair_plan(args: argparse.Namespace, env: Mapping[str, str], layout: str) -> PairPlan:
    """The plan for two nodes; UsageError / CheckpointError / KnobError on input,
    VllmMissing when vLLM (its sharding rules) is not importable."""
    sources = read_sources(args, env)
    nodes = 2
    try:
        split = model_split(resolved_text_config(sources.target_dir), layout, nodes)
        drafter_split = split
        if sources.drafter_dir is not None:
            drafter_text = resolved_text_config(sources.drafter_dir)
            drafter_split = model_split(drafter_text, layout, nodes, embeds=False)
    except ImportError as error:
        raise VllmMissing(f"vLLM is not importable here ({error})") from None
    weights_per_node = split.per_node(sources.weights_bytes)
    drafter_per = drafter_per_node(drafter_split, sources.drafter_bytes)
    keep_bf16 = sources.settings.values.SPARK_KEEP_BF16_LMHEAD
    reclaims = reclaim_per_node(split) if not keep_bf16 else (0,) * nodes
    head = "bf16" if sources.settings.values.SPARK_KEEP_BF16_LMHEAD else "int8"
    active, active_source = active_bytes(
        args, sources.config, sources.found, sources.weights_bytes, head
    )
    active_per = split.per_node(active, reads=True) if active is not None else (None,) * nodes
    plan = PairPlan(
        inputs=plan_inputs(args, sources) | {"CLUSTER_NODES": str(nodes), "CLUSTER_LAYOUT": layout},
        layout=layout,
        mem_total_bytes=sources.total,
        weights_bytes=sources.weights_bytes,
        weights_source=sources.weights_source,
        drafter_weights_bytes=sources.drafter_bytes,
        active_bytes=active,
        active_source=active_source,
        overhead_bytes=int(args.overhead_gib * GIB),
        largest_gpu_mem=largest_gpu_mem(sources.settings.values.OS_RESERVE_GB, sources.total),
        split=split,
        nodes=[],
    )
    budget: list[str] = []
    for rank in range(nodes):
        loaded = (weights_per_node[rank], drafter_per[rank], reclaims[rank])
        node, problem = _node(args, sources, rank, split, loaded, active_per[rank])
        plan.nodes.append(node)
        if problem is not None:
            budget.append(f"the {node.role}: {problem}")
        if node.kv_bytes <= 0:
            plan.problems.append(
                f"the {node.role}: no memory left for the KV cache: its weights and overhead "
                f"take {(node.vllm_share_bytes - node.kv_bytes) / GIB:.1f} GiB of "
                f"{node.vllm_share_bytes / GIB:.1f} GiB"
            )
    # the same GPU_MEM rule breaks on both hosts alike: say it once
    same = len(budget) == nodes and len({line.split(": ", 1)[1] for line in budget}) == 1
    plan.problems[:0] = [f"each node: {budget[0].split(': ', 1)[1]}"] if same else budget
    if layout == "pp" and sources.spec_method == "dflash":
        plan.notes.append(DFLASH_PP_NOTE)
    if plan.problems:
        return plan
    _add_kv(plan, args, sources)
    return plan


def _add_kv(plan: PairPlan, args: argparse.Namespace, sources: Sources) -> None:
    tp, pp = (2, 1) if plan.layout == "tp" else (1, 2)
    request = replace(
        kv_request(args, sources, plan.nodes[0].kv_bytes),
        tensor_parallel=tp,
        pipeline_parallel=pp,
        node_kv_bytes=tuple(node.kv_bytes for node in plan.nodes),
    )
    try:
        per_node = kv_geometry_per_node(request)
    except VllmMissing as error:
        plan.kv_error = str(error)
        return
    except GeometryError as error:
        plan.kv_error = str(error)
        plan.problems.append(str(error))
        return
    for node, kv in zip(plan.nodes, per_node, strict=True):
        node.kv = kv
    plan.link = link_cost(plan, args.link_gbps, args.link_latency_us)
    plan.decode_ceiling = pair_ceiling(plan, args.bandwidth_gbs)
    pool = per_node[0]
    seqs = sources.settings.values.MAX_NUM_SEQS
    length = sources.values["MAX_MODEL_LEN"]
    if pool.max_concurrency < 1:
        plan.problems.append(
            f"the pair's KV pool ({pool.pool_tokens:,} tokens) holds less than one request of "
            f"MAX_MODEL_LEN={length}"
        )
    elif pool.max_concurrency < seqs:
        plan.notes.append(
            f"MAX_NUM_SEQS={seqs} full-length requests do not all fit at once "
            f"({pool.max_concurrency:.2f}x); shorter ones do"
        )


def link_cost(plan: PairPlan, gbps: float, latency_us: float) -> dict[str, float]:
    """The link's share of one decoded token (one stream): crossings, bytes and seconds."""
    hidden = plan.split.hidden
    if plan.layout == "tp":
        reductions = 2 * plan.split.layers[0][1] + 1
        gather = plan.split.head_rows[0] * ACTIVATION_BYTES
        crossings = 1 + reductions + 1  # the step's broadcast, the all-reduces, the gather
        payload = reductions * hidden * ACTIVATION_BYTES + gather
    else:
        crossings = 2
        payload = 2 * hidden * ACTIVATION_BYTES + 8  # hidden states + residual; a token id
    seconds = crossings * latency_us * 1e-6 + payload / (gbps * 1e9 / 8)
    return {
        "gbps": gbps,
        "latency_us": latency_us,
        "crossings_per_token": float(crossings),
        "bytes_per_token": float(payload),
        "seconds_per_token": seconds,
    }


def pair_ceiling(plan: PairPlan, bandwidth_gbs: float) -> dict[str, float]:
    """tok/s per stream before speculation: memory reads on the nodes (at once with tp, one
    after the other with pp) plus the link's seconds; also without the link."""
    if any(node.active_bytes is None or node.kv is None for node in plan.nodes):
        return {}
    length = input_value(plan.inputs, "MAX_MODEL_LEN")
    short = [float(node.active_bytes or 0) + node.kv.state_bytes for node in plan.nodes if node.kv]
    full = [
        s + node.kv.attention_bytes_per_token * length
        for s, node in zip(short, plan.nodes, strict=True)
        if node.kv
    ]
    combine = max if plan.layout == "tp" else sum
    link = plan.link["seconds_per_token"]
    out = ceilings(
        bandwidth_gbs,
        lambda rate: 1 / (combine(short) / rate + link),
        lambda rate: 1 / (combine(full) / rate + link),
    )
    out["datasheet_short_context_no_link"] = bandwidth_gbs * 1e9 / combine(short)
    return out


# ---------------------------------------------------------------- output


def _g(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def _per_node(plan: PairPlan, value: Any) -> str:
    return " / ".join(value(node) for node in plan.nodes) + " (head / worker)"


def _layout_line(plan: PairPlan) -> str:
    if plan.layout == "tp":
        return "tp: tensor parallel, every layer on both nodes (vLLM --tensor-parallel-size 2)"
    first, second = (node.layers for node in plan.nodes)
    return (
        f"pp: pipeline parallel, layers {first[0]}-{first[1] - 1} on the head, "
        f"{second[0]}-{second[1] - 1} on the worker (vLLM --pipeline-parallel-size 2)"
    )


def _sharding_line(plan: PairPlan) -> str:
    s = plan.split
    replicated = f"{s.replicated_bytes / 2**20:.0f} MiB of norms, router and shared-expert gates"
    if plan.layout == "tp":
        return (
            f"each node half of every sharded weight; the embedding and lm-head split by "
            f"vocabulary ({s.vocab:,} rows padded to {s.padded_vocab:,}, "
            f"{s.head_rows[0]:,} per node); {replicated} on both in full"
        )
    return (
        "each node its layers (an equal share of the checkpoint per layer, assumed) and the "
        f"embedding ({s.embedding_rows[0]:,} rows: vLLM's Qwen3.5 builds it on every stage); "
        "the worker also the final norm, the lm-head and the whole drafter"
    )


def _lmhead_line(plan: PairPlan) -> str:
    if input_value(plan.inputs, "SPARK_KEEP_BF16_LMHEAD"):
        return "kept in bf16 (SPARK_KEEP_BF16_LMHEAD=1): nothing given back"
    if plan.split.tied:
        return "nothing given back: the head is tied to the embedding (the plugin skips it)"
    return (
        _per_node(plan, lambda n: _g(n.lmhead_reclaim_bytes))
        + " given back: each node converts the head rows it holds"
    )


def _kv_rows(plan: PairPlan) -> list[tuple[str, str]]:
    head = plan.pool
    if head is None:
        return [("KV geometry", f"unknown: {plan.kv_error}")] if plan.kv_error else []
    rows = [
        ("vLLM", f"{head.vllm_version}; {', '.join(head.notes)}"),
        ("attention block", f"{head.attention_block} tokens"),
    ]
    if head.mamba_page_bytes is not None:
        rows.append(
            (
                "Mamba page",
                f"{head.mamba_page_bytes:,} B per node padded to {head.mamba_page_padded:,} B",
            )
        )
    for node in plan.nodes:
        kv = node.kv
        if kv is None:
            continue
        groups = ", ".join(
            f"{g.kind} {g.layers}" + (f" ({g.draft_layers} drafter)" if g.draft_layers else "")
            for g in kv.groups
        )
        rows.append((f"{node.role} KV groups", f"{groups}; block of {kv.bytes_per_block:,} B"))
    i = plan.inputs
    rows += [
        ("KV blocks", f"{head.num_blocks:,} (vLLM takes the smaller node's count)"),
        ("KV pool", f"{head.pool_tokens:,} tokens across the pair"),
        (
            "concurrency",
            f"{head.max_concurrency:.2f}x at MAX_MODEL_LEN={i['MAX_MODEL_LEN']} "
            f"(MAX_NUM_SEQS={i['MAX_NUM_SEQS']})",
        ),
    ]
    return rows


def _link_line(plan: PairPlan) -> str:
    k = plan.link
    what = (
        "the step's broadcast, 2 all-reduces per layer and 1 after the embedding "
        "(hidden x bf16 each), 1 gather of the head's logits"
        if plan.layout == "tp"
        else "hidden states + residual handed to the worker, the sampled token back"
    )
    return (
        f"assumed {k['gbps']:.0f} Gb/s, {k['latency_us']:.0f} us per crossing: "
        f"{k['crossings_per_token']:.0f} crossings ({what}), {k['bytes_per_token'] / 1024:.0f} KiB "
        f"= {k['seconds_per_token'] * 1e3:.2f} ms per token"
    )


def _ceiling_line(plan: PairPlan) -> str:
    c = plan.decode_ceiling
    order = "both nodes read at once" if plan.layout == "tp" else "the stages read in turn"
    return (
        f"{c['datasheet_short_context']:.0f} tok/s short context, "
        f"{c['datasheet_full_context']:.0f} at MAX_MODEL_LEN (datasheet bandwidth, link "
        f"included; {c['datasheet_short_context_no_link']:.0f} without it); "
        f"{c['measured_low_short_context']:.0f}-{c['measured_high_short_context']:.0f} short at "
        f"the measured 218-234 GB/s; {order}; per stream, before speculation"
    )


def render_pair(plan: PairPlan) -> str:
    i = plan.inputs
    rows: list[tuple[str, str]] = [
        *model_rows(i),
        *assumption_rows(i, plan.pool),
        ("nodes", f"2 ({_layout_line(plan)})"),
        ("machine memory", f"{_g(plan.mem_total_bytes)} each"),
        (
            "GPU_MEM",
            f"{i['GPU_MEM']} -> vLLM share " + _per_node(plan, lambda n: _g(n.vllm_share_bytes)),
        ),
        ("weights", f"{_g(plan.weights_bytes)} in all ({plan.weights_source})"),
        ("weights per node", _per_node(plan, lambda n: _g(n.weights_bytes))),
        ("sharding", _sharding_line(plan)),
        ("drafter per node", _per_node(plan, lambda n: _g(n.drafter_weights_bytes))),
        ("int8 lm-head", _lmhead_line(plan)),
        ("overhead (assumed)", f"{_g(plan.overhead_bytes)} per node"),
        ("CUDA-graph estimate", _per_node(plan, lambda n: _g(n.cudagraph_bytes))),
        ("KV memory", _per_node(plan, lambda n: _g(n.kv_bytes))),
        *_kv_rows(plan),
        (
            "left to the OS",
            _per_node(plan, lambda n: _g(n.os_left_bytes))
            + f", OS_RESERVE_GB={i['OS_RESERVE_GB']} each",
        ),
        ("largest GPU_MEM", f"{plan.largest_gpu_mem:.2f} keeps OS_RESERVE_GB on each node"),
    ]
    if plan.active_bytes is not None:
        rows.append(
            (
                "read per token",
                _per_node(plan, lambda n: _g(n.active_bytes or 0))
                + f" of {_g(plan.active_bytes)} weights ({plan.active_source})",
            )
        )
    else:
        rows.append(("read per token", plan.active_source))
    if plan.link:
        rows.append(("link", _link_line(plan)))
    if plan.decode_ceiling:
        rows.append(("decode ceiling", _ceiling_line(plan)))
    rows += [("note", note) for note in plan.notes]
    return with_verdict(
        rows, plan.problems, plan.pool is not None, plan.kv_error, "fits on both nodes"
    )


def pair_json(plan: PairPlan) -> str:
    data = asdict(plan)
    data["fits"] = plan.fits
    pool = plan.pool
    data["pool_tokens"] = pool.pool_tokens if pool else None
    data["max_concurrency"] = pool.max_concurrency if pool else None
    return json.dumps(data, indent=1, default=str)


def run(args: argparse.Namespace, env: Mapping[str, str], layout: str) -> int:
    """Exit status as one node's plan: 0 fits, 1 does not, 2 bad input, 3 vLLM missing."""
    try:
        plan = make_pair_plan(args, env, layout)
    except (KnobError, CheckpointError, UsageError) as error:
        return fail("sparkserve plan", error, EXIT_BAD_INPUT)
    except VllmMissing as error:
        return fail(
            "sparkserve plan", f"--nodes 2 needs vLLM's sharding rules: {error}", EXIT_STOPPED
        )
    print(pair_json(plan) if args.json else render_pair(plan))
    if plan.pool is None and not plan.problems:
        return fail("sparkserve plan", plan.kv_error, EXIT_STOPPED)
    return EXIT_OK if plan.fits else EXIT_FAILED
