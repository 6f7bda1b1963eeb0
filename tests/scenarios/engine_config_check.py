"""Turn launcher command lines into vLLM engine configurations with vLLM's own parser.

Usage: engine_config_check.py IN.json OUT.json, where IN.json maps a case name to the argv
after `vllm serve`. Writes, per case, either the facts of the built VllmConfig or the error.
One process for every case: importing vLLM costs seconds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sparkserve.memory.kv import cpu_platform_keeps_triton

# vLLM 0.34's CPU platform wants Triton on x86: the planner's step, before vLLM decides it
cpu_platform_keeps_triton()

from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.entrypoints.common.cli_args import make_arg_parser  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402


def facts(argv: list[str]) -> dict:
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    config = EngineArgs.from_cli_args(args).create_engine_config()
    spec = config.speculative_config
    return {
        "model": config.model_config.model,
        "architecture": config.model_config.architectures[0],
        "served_model_name": config.model_config.served_model_name,
        "max_model_len": config.model_config.max_model_len,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
        # vLLM 0.34's extensible KV cache (absent before it: None)
        "extensible_kv_cache": getattr(config.cache_config, "enable_extensible_kv_cache", None),
        "enable_prefix_caching": config.cache_config.enable_prefix_caching,
        "mamba_cache_mode": config.cache_config.mamba_cache_mode,
        "load_format": str(config.load_config.load_format),
        "speculative_method": spec.method if spec else None,
        "num_speculative_tokens": spec.num_speculative_tokens if spec else None,
        "draft_model": spec.draft_model_config.model if spec and spec.draft_model_config else None,
        "draft_architecture": (
            spec.draft_model_config.architectures[0] if spec and spec.draft_model_config else None
        ),
        "tool_call_parser": getattr(args, "tool_call_parser", None),
        "reasoning_parser": getattr(config.structured_outputs_config, "reasoning_parser", None),
        "default_chat_template_kwargs": getattr(args, "default_chat_template_kwargs", None),
        "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        "pipeline_parallel_size": config.parallel_config.pipeline_parallel_size,
        "nnodes": config.parallel_config.nnodes,
        "node_rank": config.parallel_config.node_rank,
        "master_addr": config.parallel_config.master_addr,
        "distributed_executor_backend": config.parallel_config.distributed_executor_backend,
        "distributed_timeout_seconds": config.parallel_config.distributed_timeout_seconds,
        "headless": bool(getattr(args, "headless", False)),
        "shutdown_timeout": config.shutdown_timeout,
        "middleware": list(getattr(args, "middleware", [])),
    }


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    results = {}
    for name, argv in cases.items():
        try:
            results[name] = {"ok": True, **facts(argv)}
        except Exception as error:  # report every case, not just the first failure
            results[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"[:2000]}
    Path(sys.argv[2]).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
