"""One rank of a two-node vLLM engine, as far as this CPU machine can take it: vLLM's own
parser and engine config for the rank's command line, then vLLM's own model class built on
the meta device (no memory, no weights) inside a real two-process gloo group, to read what
vLLM puts on this rank. One process plays its rank in several layouts, one after the other
(each group torn down before the next: vLLM is imported once per process, not per layout).

Usage: pair_rank.py MODEL_DIR DRAFTER_DIR LAYOUTS RANK GROUP_PORTS OUT_DIR, where LAYOUTS is
a comma-separated list of tp, pp and one (a single node, world size 1: the whole model; rank
0 only) and GROUP_PORTS one free loopback port per layout for the ranks' torch.distributed
group. Writes the facts of each layout to OUT_DIR/LAYOUT-RANK.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from vllm.config.vllm import set_current_vllm_config
from vllm.distributed.parallel_state import (
    destroy_distributed_environment,
    destroy_model_parallel,
    init_distributed_environment,
    initialize_model_parallel,
)
from vllm.distributed.utils import get_pp_indices
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.model_executor.model_loader.utils import initialize_model
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.utils.torch_utils import set_default_torch_dtype

# The Spark's serve.sh settings (FACTS): the 122B geometry, DFlash n=12, prefix caching.
SERVE_ARGS = [
    "--load-format", "dummy", "--skip-tokenizer-init", "--max-model-len", "262144",
    "--max-num-seqs", "3", "--max-num-batched-tokens", "8192", "--gpu-memory-utilization",
    "0.82", "--enable-prefix-caching",
]  # fmt: skip
# The head's address on the link is never contacted: only the config is built.
HEAD_ADDR = "192.168.100.1"
MASTER_PORT = "29501"


def argv(model: str, drafter: str, layout: str, rank: int) -> list[str]:
    spec = {"method": "dflash", "num_speculative_tokens": 12, "model": drafter}
    args = ["--model", model, *SERVE_ARGS, "--speculative-config", json.dumps(spec)]
    if layout == "one":
        return args
    size = "--tensor-parallel-size" if layout == "tp" else "--pipeline-parallel-size"
    return [
        *args, "--nnodes", "2", "--node-rank", str(rank), "--master-addr", HEAD_ADDR,
        "--master-port", MASTER_PORT, "--distributed-executor-backend", "mp", size, "2",
    ]  # fmt: skip


def dflash_over_pp(model: torch.nn.Module) -> str:
    """What model runner V2's own check says of DFlash across pipeline stages on this model
    (the CPU build runs model runner V1, which never asks)."""
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        verify_supports_aux_hidden_states_over_pp,
    )

    try:
        verify_supports_aux_hidden_states_over_pp(model, "dflash")
    except ValueError as error:
        return str(error)
    return "supported"


def build(model: str, drafter: str, layout: str, node: int, port: str) -> dict[str, object]:
    """The facts of one layout on this rank; the group is torn down afterwards."""
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv(model, drafter, layout, node))
    config = EngineArgs.from_cli_args(args).create_engine_config()
    parallel = config.parallel_config
    layers = config.model_config.hf_text_config.num_hidden_layers
    spec = config.speculative_config
    facts = {
        "world_size": parallel.world_size,
        "nnodes": parallel.nnodes,
        "node_rank": parallel.node_rank,
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "pipeline_parallel_size": parallel.pipeline_parallel_size,
        "master_addr": parallel.master_addr,
        "master_port": parallel.master_port,
        "executor": str(parallel.distributed_executor_backend),
        "kv_heads_per_rank": config.model_config.get_num_kv_heads(parallel),
        "head_size": config.model_config.get_head_size(),
        "draft_tensor_parallel_size": spec.draft_tensor_parallel_size if spec else None,
        "pp_indices": [
            list(get_pp_indices(layers, stage, parallel.pipeline_parallel_size))
            for stage in range(parallel.pipeline_parallel_size)
        ],
    }
    world = 1 if layout == "one" else 2
    init_distributed_environment(world, node, f"tcp://127.0.0.1:{port}", 0, "gloo")
    with set_current_vllm_config(config):
        initialize_model_parallel(
            parallel.tensor_parallel_size, parallel.pipeline_parallel_size, backend="gloo"
        )
    with set_default_torch_dtype(config.model_config.dtype), torch.device("meta"):
        built = initialize_model(config)
    facts["param_bytes"] = sum(p.numel() * p.element_size() for p in built.parameters())
    facts["layers"] = [built.model.start_layer, built.model.end_layer]
    facts["dtype"] = str(config.model_config.dtype)
    facts["dflash_over_pp"] = dflash_over_pp(built)
    destroy_model_parallel()
    destroy_distributed_environment()
    return facts


def main() -> None:
    model, drafter, layouts, rank, ports, out = sys.argv[1:7]
    for layout, port in zip(layouts.split(","), ports.split(","), strict=True):
        facts = build(model, drafter, layout, int(rank), port)
        (Path(out) / f"{layout}-{rank}.json").write_text(json.dumps(facts, indent=1))


if __name__ == "__main__":
    main()
