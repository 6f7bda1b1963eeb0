"""The bytes one decode step must read, and the tok/s that bandwidth allows: a model, not a
measurement.

From a Qwen3.5-style hybrid MoE's config.json (its geometry and its `quantization_config`) it
counts, by kind, what one decode step reads from memory without speculation: the attention and
GatedDeltaNet (GDN) projections, the routed experts the step touches, the shared experts, the
router and the norms, one embedding row per stream, the lm head (bf16, or int8 with a float32
scale per row as sparkserve's int8 head keeps it), the KV cache of the full-attention layers up
to the context depth, and the GDN recurrent state (SSM and conv) of each stream.

Assumptions, each stated where it is used:
- a quantized linear layer reads its packed weights (bits / 8 bytes an element) and one fp16
  scale per group; a symmetric checkpoint's zero points are not read (GPTQ-Marlin's symmetric
  path takes none);
- the routed experts a step touches at S streams: E x (1 - (1 - k/E)^S) of E experts (k per
  token), each stream picking k experts uniformly and independently; one stream reads exactly k;
- every stream reads its own KV and state; the weights are read once per step for all streams;
- the MTP layer and any drafter are not read (no speculation).

The ceiling is bandwidth / bytes: an upper bound on decode tok/s, not a forecast.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Datasheet peak memory bandwidths (GB/s); Spark's measured range as shared FACTS gives it.
BANDWIDTHS_GBS: dict[str, float] = {
    "spark_datasheet": 273.0,  # NVIDIA DGX Spark, LPDDR5x
    "spark_measured_low": 218.0,  # measured by others (shared FACTS)
    "spark_measured_high": 234.0,
    "h100_sxm_datasheet": 3350.0,  # NVIDIA H100 SXM5, HBM3
    "h200_datasheet": 4800.0,  # NVIDIA H200, HBM3e
}
BF16 = 2
FP32 = 4
SCALE_BYTES = 2  # one fp16 scale per quantization group
INT8_HEAD_SCALE_BYTES = 4  # sparkserve's int8 head: one float32 scale per vocabulary row
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}


class StepBytesError(ValueError):
    """The config lacks a field the model needs; the message names it."""


@dataclass(frozen=True)
class Geometry:
    """What the count needs of a Qwen3.5-style hybrid MoE's text config."""

    hidden: int
    layers: int
    full_attention_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    attn_output_gate: bool
    gdn_key_heads: int
    gdn_value_heads: int
    gdn_key_dim: int
    gdn_value_dim: int
    conv_kernel: int
    experts: int
    experts_per_token: int
    expert_intermediate: int
    shared_intermediate: int
    vocab: int
    ssm_state_bytes: int  # per element of the GDN recurrent state
    kv_bytes: int  # per element of the KV cache

    @property
    def gdn_layers(self) -> int:
        return self.layers - self.full_attention_layers


@dataclass(frozen=True)
class Quantization:
    """Weight-only integer quantization of the decoder layers' linear layers."""

    bits: int
    group_size: int
    unquantized: tuple[str, ...]  # extra_config keys (names or regexes) left at 16 bits

    def bytes_per_weight(self) -> float:
        return self.bits / 8 + SCALE_BYTES / self.group_size

    def keeps(self, module: str) -> bool:
        """Whether a module (a name like 'linear_attn.in_proj_a') stays at 16 bits."""
        for key in self.unquantized:
            if key == module or module.endswith(key) or key.endswith(module):
                return True
            try:
                if re.search(key, module):
                    return True
            except re.error:
                continue
        return False


def _text(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def _need(text: Mapping[str, Any], key: str) -> int:
    if key not in text:
        raise StepBytesError(f"config.json has no {key}: the bytes per step need it")
    return int(text[key])


def geometry(config: Mapping[str, Any]) -> Geometry:
    """The geometry of a config.json (its text_config where it has one)."""
    text = _text(config)
    layers = _need(text, "num_hidden_layers")
    types = text.get("layer_types")
    if types:
        full = sum(1 for t in types[:layers] if t == "full_attention")
    else:
        full = layers // _need(text, "full_attention_interval")
    return Geometry(
        hidden=_need(text, "hidden_size"),
        layers=layers,
        full_attention_layers=full,
        heads=_need(text, "num_attention_heads"),
        kv_heads=_need(text, "num_key_value_heads"),
        head_dim=_need(text, "head_dim"),
        attn_output_gate=bool(text.get("attn_output_gate", True)),
        gdn_key_heads=_need(text, "linear_num_key_heads"),
        gdn_value_heads=_need(text, "linear_num_value_heads"),
        gdn_key_dim=_need(text, "linear_key_head_dim"),
        gdn_value_dim=_need(text, "linear_value_head_dim"),
        conv_kernel=_need(text, "linear_conv_kernel_dim"),
        experts=_need(text, "num_experts"),
        experts_per_token=_need(text, "num_experts_per_tok"),
        expert_intermediate=_need(text, "moe_intermediate_size"),
        shared_intermediate=int(text.get("shared_expert_intermediate_size", 0)),
        vocab=_need(text, "vocab_size"),
        ssm_state_bytes=DTYPE_BYTES[str(text.get("mamba_ssm_dtype", "bfloat16"))],
        kv_bytes=BF16,
    )


def quantization(config: Mapping[str, Any]) -> Quantization | None:
    """The checkpoint's weight quantization, or None for a 16-bit checkpoint."""
    quant = config.get("quantization_config") or _text(config).get("quantization_config")
    if not quant:
        return None
    extra = quant.get("extra_config") or {}
    kept = tuple(k for k, v in extra.items() if int(v.get("bits", 16)) >= 16)
    return Quantization(int(quant["bits"]), int(quant["group_size"]), kept)


@dataclass(frozen=True)
class StepBytes:
    """Bytes one decode step reads, by kind (the whole step: every stream's share summed)."""

    streams: int
    context: int
    head: str
    by_kind: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.by_kind.values())

    def share(self, kind: str) -> float:
        return self.by_kind[kind] / self.total


def _linear(rows: int, cols: int, quant: Quantization | None, module: str) -> float:
    """Bytes of a linear layer's weights as the kernel reads them."""
    if quant is None or quant.keeps(module):
        return rows * cols * BF16
    return rows * cols * quant.bytes_per_weight()


def experts_touched(experts: int, per_token: int, streams: int) -> float:
    """Expected distinct experts of one layer that S streams touch, each picking `per_token`
    uniformly and independently (an assumption; real routing is skewed)."""
    if streams == 1:
        return float(per_token)
    return experts * (1 - (1 - per_token / experts) ** streams)


def step_bytes(
    geo: Geometry,
    quant: Quantization | None,
    *,
    head: str = "int8",
    context: int = 0,
    streams: int = 1,
) -> StepBytes:
    """Bytes one decode step reads at `streams` streams, each with `context` tokens behind it."""
    if head not in ("int8", "bf16"):
        raise StepBytesError(f"head {head!r}: int8 or bf16")
    if streams < 1 or context < 0:
        raise StepBytesError("streams must be >= 1 and context >= 0")
    g, h = geo, geo.hidden
    q_out = g.heads * g.head_dim * (2 if g.attn_output_gate else 1)
    kv_out = g.kv_heads * g.head_dim
    attention = (
        _linear(q_out, h, quant, "self_attn.q_proj")
        + 2 * _linear(kv_out, h, quant, "self_attn.k_proj")
        + _linear(h, g.heads * g.head_dim, quant, "self_attn.o_proj")
        + 2 * g.head_dim * BF16  # q_norm, k_norm
    ) * g.full_attention_layers
    key_dim = g.gdn_key_heads * g.gdn_key_dim
    value_dim = g.gdn_value_heads * g.gdn_value_dim
    gdn = (
        _linear(2 * key_dim + 2 * value_dim, h, quant, "linear_attn.in_proj_qkvz")
        + _linear(g.gdn_value_heads, h, quant, "linear_attn.in_proj_b")
        + _linear(g.gdn_value_heads, h, quant, "linear_attn.in_proj_a")
        + (2 * key_dim + value_dim) * g.conv_kernel * BF16  # conv1d
        + 2 * g.gdn_value_heads * FP32  # A_log, dt_bias
        + g.gdn_value_dim * BF16  # the gated norm
        + _linear(h, value_dim, quant, "linear_attn.out_proj")
    ) * g.gdn_layers
    one_expert = 3 * _linear(g.expert_intermediate, h, quant, "mlp.experts")
    routed = one_expert * experts_touched(g.experts, g.experts_per_token, streams) * g.layers
    # each projection by the name vLLM resolves its quantization for (extra_config keys may
    # name one projection, or a pattern over them)
    shared = (
        _linear(g.shared_intermediate, h, quant, "mlp.shared_expert.gate_proj")
        + _linear(g.shared_intermediate, h, quant, "mlp.shared_expert.up_proj")
        + _linear(h, g.shared_intermediate, quant, "mlp.shared_expert.down_proj")
        + h * BF16  # shared_expert_gate (one output)
    ) * g.layers
    router = g.experts * h * BF16 * g.layers
    norms = (2 * g.layers + 1) * h * BF16
    embedding = streams * h * BF16  # one row per stream
    int8_row = h + INT8_HEAD_SCALE_BYTES  # a byte a weight and a float32 scale
    lm_head = g.vocab * (h * BF16 if head == "bf16" else int8_row)
    kv = streams * context * kv_bytes_per_token(geo)
    state = streams * state_bytes_per_stream(geo)
    return StepBytes(
        streams=streams,
        context=context,
        head=head,
        by_kind={
            "attention": attention, "gdn": gdn, "routed_experts": routed,
            "shared_experts": shared, "router": router, "norms": norms,
            "embedding_rows": embedding, "lm_head": lm_head, "kv_cache": kv,
            "gdn_state": state,
        },
    )  # fmt: skip


def weights_per_step(config: Mapping[str, Any], head: str) -> int | None:
    """The weights one step reads at one stream (no KV, no state), for an integer-quantized
    config this module models; None where it does not (no quantization_config it reads, or a
    field missing): a 16-bit count of an FP8 checkpoint's geometry would double its bytes."""
    try:
        quant = quantization(config)
        if quant is None:
            return None
        step = step_bytes(geometry(config), quant, head=head)
    except (StepBytesError, KeyError, TypeError, ValueError):
        return None
    return int(step.total - step.by_kind["kv_cache"] - step.by_kind["gdn_state"])


def kv_bytes_per_token(geo: Geometry) -> int:
    """KV bytes of one token of context over the full-attention layers (K and V)."""
    return geo.full_attention_layers * 2 * geo.kv_heads * geo.head_dim * geo.kv_bytes


def state_bytes_per_stream(geo: Geometry) -> int:
    """One stream's GDN state over the GDN layers: the SSM state and the conv window."""
    ssm = geo.gdn_value_heads * geo.gdn_key_dim * geo.gdn_value_dim * geo.ssm_state_bytes
    conv_dim = 2 * geo.gdn_key_heads * geo.gdn_key_dim + geo.gdn_value_heads * geo.gdn_value_dim
    conv = conv_dim * (geo.conv_kernel - 1) * BF16
    return (ssm + conv) * geo.gdn_layers


def ceiling_tok_s(step: StepBytes, bandwidth_gbs: float) -> float:
    """Aggregate decode tok/s that `bandwidth_gbs` allows: streams tokens per step."""
    return step.streams * bandwidth_gbs * 1e9 / step.total


def table(
    config: Mapping[str, Any],
    contexts: tuple[int, ...] = (0, 32768, 131072),
    streams: tuple[int, ...] = (1,),
    heads: tuple[str, ...] = ("int8", "bf16"),
) -> list[dict[str, Any]]:
    """One row per (head, streams, context): bytes by kind, total, and the ceilings."""
    geo, quant = geometry(config), quantization(config)
    rows = []
    for head in heads:
        for s in streams:
            for ctx in contexts:
                step = step_bytes(geo, quant, head=head, context=ctx, streams=s)
                rows.append({
                    "head": head, "streams": s, "context": ctx,
                    "bytes_by_kind": step.by_kind, "bytes_total": step.total,
                    "lm_head_share": step.share("lm_head"),
                    "ceiling_tok_s": {
                        name: ceiling_tok_s(step, gbs) for name, gbs in BANDWIDTHS_GBS.items()
                    },
                })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Bytes per decode step and the bandwidth-bound ceiling (a model)."
    )
    parser.add_argument("config", type=Path, help="a model's config.json")
    parser.add_argument("--contexts", default="0,32768,131072")
    parser.add_argument("--streams", default="1")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        config = json.loads(args.config.read_text())
        rows = table(
            config,
            tuple(int(c) for c in args.contexts.split(",")),
            tuple(int(s) for s in args.streams.split(",")),
        )
    except (OSError, ValueError, StepBytesError) as error:
        print(f"step_bytes: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("model, not a measurement: bytes one decode step reads, and bandwidth / bytes")
    names = list(BANDWIDTHS_GBS)
    print(f"{'head':5} {'streams':>7} {'context':>8} {'GB/step':>8} {'head%':>6} "
          + " ".join(f"{n:>20}" for n in names))  # fmt: skip
    for r in rows:
        print(f"{r['head']:5} {r['streams']:>7} {r['context']:>8} "
              f"{r['bytes_total'] / 1e9:>8.3f} {100 * r['lm_head_share']:>5.1f}% "
              + " ".join(f"{r['ceiling_tok_s'][n]:>16.1f} t/s" for n in names))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
