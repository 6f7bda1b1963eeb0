"""What each node of a pair holds of a checkpoint, by vLLM's own sharding rules.

From config.json alone (no weights). The rules, as vLLM's model classes build the layers
(Qwen3.5 / Qwen3-Next: `qwen3_next.py`, `qwen3_5.py`; tests/plan/test_plan_pair.py checks them
against the parameters vLLM itself creates on each rank):

- tensor parallel (tp): every projection, expert and convolution is split in equal halves.
  The embedding and the lm-head are split by vocabulary rows (`VocabParallelEmbedding`,
  `ParallelLMHead`: the vocabulary padded to a multiple of 64, then divided). Replicated, so
  counted in full on each node: the RMS norms (per layer, per attention head dim, the gated
  norm of GatedDeltaNet, the final one), the MoE router (`GateLinear`, a `ReplicatedLinear`)
  and the shared-expert gate (`ReplicatedLinear`).
- pipeline parallel (pp): each node holds its decoder layers (vLLM's `get_pp_indices`) and
  the whole embedding: vLLM 0.33's Qwen3.5 and Qwen3-Next models build it on every stage
  (`Qwen3_5Model` / `Qwen3NextModel.__init__` have no first-stage check, unlike Llama's); the
  last node also holds the final norm and the lm-head (a copy of the embedding when the two
  are tied). A drafter lives on the last node (vLLM's model runner builds it on the last
  pipeline stage only).

Stated assumptions: the embedding, the head and the replicated parts are stored in the
config's dtype (int4 checkpoints keep them unquantised); the rest of the bytes belong to the
decoder layers, an equal share per layer (exact for a pipeline split whose stages hold the
same mix of layer types, as 24 + 24 of the 122B's repeating four-layer pattern do); a
quantised weight's scales split with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkserve.memory.checkpoint import CheckpointError, layer_kinds

LAYOUTS = ("tp", "pp")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Split:
    """How one model's bytes fall on the nodes of a pair (node 0 is the head)."""

    layout: str
    layers: tuple[tuple[int, int], ...]  # per node: [first, end) of its decoder layers
    embedding_rows: tuple[int, ...]  # per node: rows of the embedding it holds
    head_rows: tuple[int, ...]  # per node: rows of the lm-head it holds (0: none)
    hidden: int
    row_bytes: int  # one embedding or lm-head row
    replicated_bytes: int  # on each node in full with tp (norms, router, gates)
    final_norm_bytes: int
    vocab: int
    padded_vocab: int
    tied: bool  # the lm-head is the embedding (one copy in the checkpoint)

    @property
    def nodes(self) -> int:
        return len(self.layers)

    @property
    def edge_bytes(self) -> int:
        """The checkpoint's embedding, lm-head and final norm."""
        matrices = 1 if self.tied else 2
        return self.vocab * matrices * self.row_bytes + self.final_norm_bytes

    def per_node(self, whole: int, *, reads: bool = False) -> tuple[int, ...]:
        """`whole` (a checkpoint's bytes, or with `reads` the bytes a decoded token reads) on
        each node. A token reads the embedding once, on the first stage: with `reads` the
        later stages' copies are not counted, but for the last stage's tied head, which is
        its embedding."""
        layer_count = self.layers[-1][1]
        if self.layout == "tp":
            body = max(whole - self.edge_bytes - self.replicated_bytes, 0)
            return tuple(
                body // self.nodes
                + (self.embedding_rows[n] + self.head_rows[n]) * self.row_bytes
                + self.replicated_bytes
                + self.final_norm_bytes
                for n in range(self.nodes)
            )
        body = max(whole - self.edge_bytes, 0)
        return tuple(
            body * (end - start) // layer_count
            + (self._embedding_read(n) if reads else self.embedding_rows[n]) * self.row_bytes
            + self.head_rows[n] * self.row_bytes
            + (self.final_norm_bytes if n == self.nodes - 1 else 0)
            for n, (start, end) in enumerate(self.layers)
        )

    def _embedding_read(self, n: int) -> int:
        """Rows a decoded token reads of stage n's embedding: the first stage's, and the last
        stage's when it is the tied head."""
        tied_head = self.tied and n == self.nodes - 1
        return self.embedding_rows[n] if n == 0 or tied_head else 0


def _dtype_bytes(text: dict[str, Any]) -> int:
    name = str(text.get("dtype") or text.get("torch_dtype") or "bfloat16")
    return DTYPE_BYTES.get(name.removeprefix("torch."), 2)


def resolved_text_config(directory: Path) -> dict[str, Any]:
    """The text model's config as vLLM sees it: config.json with the defaults of its
    transformers class filled in (a config.json may leave out, say, the expert count).
    ImportError without transformers; CheckpointError when it cannot read the file."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(directory))
    except Exception as error:  # any reason transformers gives: one line
        first = (str(error).strip().splitlines() or [""])[0]
        raise CheckpointError(
            f"{directory}: transformers cannot read its config.json ({type(error).__name__}: "
            f"{first})"
        ) from None
    return dict(config.get_text_config().to_dict())


def replicated_elements(text: dict[str, Any]) -> int:
    """Elements every tensor-parallel rank holds in full: the norms, the MoE router and the
    shared-expert gate (the final norm not included)."""
    hidden = int(text["hidden_size"])
    head_dim = int(text.get("head_dim") or hidden // int(text["num_attention_heads"]))
    per_layer = 2 * hidden  # input and post-attention RMS norms
    if text.get("num_experts"):
        per_layer += int(text["num_experts"]) * hidden  # the router (GateLinear)
        if text.get("shared_expert_intermediate_size"):
            per_layer += hidden  # shared_expert_gate
    total = 0
    for kind in layer_kinds(text):
        total += per_layer
        if kind == "full_attention":
            total += 2 * head_dim  # q_norm, k_norm
        else:
            total += int(text.get("linear_value_head_dim") or 0)  # GatedDeltaNet's gated norm
    return total


def model_split(text: dict[str, Any], layout: str, nodes: int, *, embeds: bool = True) -> Split:
    """The split over `nodes` machines (one GPU each) of a model whose text config is `text`
    (`resolved_text_config`). `embeds=False` for a drafter that shares the target's embedding
    and head (DFlash): it holds neither. Needs vLLM (its padding and layer partition);
    ImportError when it is not importable."""
    from vllm.distributed.utils import get_pp_indices
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        DEFAULT_VOCAB_PADDING_SIZE,
        pad_vocab_size,
    )

    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: must be one of {', '.join(LAYOUTS)}")
    if nodes < 1:
        raise ValueError(f"nodes {nodes}: must be 1 or more")
    hidden = int(text["hidden_size"])
    dtype = _dtype_bytes(text)
    layer_count = len(layer_kinds(text))
    vocab = int(text.get("vocab_size") or 0) if embeds else 0
    padded = pad_vocab_size(vocab, DEFAULT_VOCAB_PADDING_SIZE) if vocab else 0
    tied = bool(text.get("tie_word_embeddings", False))
    last = nodes - 1
    if layout == "tp":
        rows = padded // nodes
        layers = tuple((0, layer_count) for _ in range(nodes))
        embedding = tuple(rows for _ in range(nodes))
        head = tuple(0 if tied else rows for _ in range(nodes))
    else:
        layers = tuple(get_pp_indices(layer_count, n, nodes) for n in range(nodes))
        embedding = tuple(padded for _ in range(nodes))  # on every stage: see the docstring
        # a tied head is the last stage's embedding itself, as in tp: no second copy
        head = tuple(padded if n == last and not tied else 0 for n in range(nodes))
    return Split(
        layout=layout,
        layers=layers,
        embedding_rows=embedding,
        head_rows=head,
        hidden=hidden,
        row_bytes=hidden * dtype,
        replicated_bytes=replicated_elements(text) * dtype,
        final_norm_bytes=hidden * dtype,
        vocab=vocab,
        padded_vocab=padded,
        tied=tied,
    )


def drafter_per_node(split: Split, whole: int) -> tuple[int, ...]:
    """A drafter's bytes per node: split like the target with tp (vLLM gives the drafter the
    target's tensor-parallel size), all on the last node with pp; none without a drafter."""
    if whole == 0:
        return (0,) * split.nodes
    if split.layout == "pp":
        return tuple(whole if n == split.nodes - 1 else 0 for n in range(split.nodes))
    return split.per_node(whole)
