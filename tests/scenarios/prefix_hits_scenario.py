"""Prefix-cache hits on the Spark's KV layout, from vLLM's own scheduler: no model, no memory.

Run as a script with the vLLM under test first on sys.path: argv[1] a JSON object of cases
{name: {"target", "drafter", "env", "extra_args", "patches"}}, argv[2] the JSON file to write.
For each case the planner (sparkserve.memory.kv, the launcher's command for the Spark's
settings: DFlash n=12, prefix caching, Mamba align mode) builds vLLM's config and the
scheduler's KV cache config; vLLM's `Scheduler` then serves prompts as the engine core does,
with every model step answered by one sampled token (the KV cache manager decides every hit;
no kernel runs). Prompts: each length sent twice (a repeated prompt), and two prompts sharing
their first tokens then differing (a shared prefix). A hit is the second request's
`num_cached_tokens`, what vLLM counts in vllm:prefix_cache_hits.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from sparkserve.memory.kv import cpu_platform_keeps_triton

cpu_platform_keeps_triton()

REPEATED = (1200, 2300, 2800, 3400, 5040)
# (shared tokens, tokens after them)
SHARED = ((2300, 400), (3000, 400), (4600, 400))
KV_BYTES = int(26.55 * 2**30)  # the Spark plan's KV memory at GPU_MEM 0.82 (docs/MEMORY.md)

SPARK = {
    "MAX_MODEL_LEN": "262144", "MAX_NUM_SEQS": "3", "MAX_BATCHED_TOKENS": "8192",
    "NUM_SPEC_TOKENS": "12", "PREFIX_CACHE": "1",
}  # fmt: skip


def build(case: dict[str, Any]) -> tuple[Any, Any]:
    from sparkserve.launch.settings import resolve_settings
    from sparkserve.launch.versions import installed_vllm
    from sparkserve.launch.vllm_command import vllm_command
    from sparkserve.memory.kv import KvRequest, scheduler_inputs

    knobs = dict(SPARK, MODEL=case["target"], DRAFT_MODEL=case["drafter"])
    knobs["EXTRA_ARGS"] = case.get("extra_args", "")
    settings = resolve_settings({}, "dflash", knobs)
    argv = vllm_command(settings, installed_vllm(), True).argv
    request = KvRequest(
        target=Path(case["target"]), drafter=Path(case["drafter"]), spec_method="dflash",
        num_spec_tokens=12, max_model_len=262144, max_num_seqs=3, max_batched_tokens=8192,
        kv_bytes=KV_BYTES, serve_argv=argv, patches=tuple(case.get("patches", ())),
    )  # fmt: skip
    return scheduler_inputs(request)


class Engine:
    """vLLM's Scheduler with the engine core's block sizes and request hasher."""

    def __init__(self, config: Any, kv_config: Any) -> None:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils as utils
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        config.cache_config.num_gpu_blocks = kv_config.num_blocks  # as the engine core sets it
        scheduler_block, hash_block = utils.resolve_kv_cache_block_sizes(kv_config, config)
        kv_config.hash_block_size = hash_block
        kv_config.cache_hit_alignment_tokens = utils.resolve_cache_hit_alignment_tokens(
            kv_config, config, scheduler_block, hash_block
        )
        pool, _ = utils.get_kv_cache_capacity(config, kv_config)
        self.blocks = {
            "pool_tokens": int(pool),
            "num_blocks": int(kv_config.num_blocks),
            "scheduler_block": scheduler_block,
            "hash_block": hash_block,
            "hit_unit": kv_config.cache_hit_alignment_tokens,
            "groups": [g.kv_cache_spec.block_size for g in kv_config.kv_cache_groups],
        }
        self.scheduler = Scheduler(
            vllm_config=config, kv_cache_config=kv_config,
            structured_output_manager=StructuredOutputManager(config),
            block_size=scheduler_block, hash_block_size=hash_block,
        )  # fmt: skip
        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        utils.init_none_hash(hash_fn)
        self.hasher = utils.get_request_block_hasher(
            hash_block, hash_fn, config.num_hash_lookahead_tokens
        )
        self.count = 0

    def serve(self, tokens: list[int]) -> int:
        """One request to the end (one generated token); its cached tokens."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request

        self.count += 1
        request = Request(
            f"r{self.count}", tokens, SamplingParams(max_tokens=1, temperature=0.0), None,
            block_hasher=self.hasher,
        )  # fmt: skip
        self.scheduler.add_request(request)
        cached = None
        for _ in range(64):
            out = self.scheduler.schedule()
            ids = list(out.num_scheduled_tokens)
            if cached is None and request.request_id in ids:
                # schedule() has added this step's tokens to the cached ones it started from
                cached = request.num_computed_tokens - out.num_scheduled_tokens[request.request_id]
            done = [
                rid for rid in ids
                if self.scheduler.requests[rid].num_computed_tokens
                + out.num_scheduled_tokens[rid] >= self.scheduler.requests[rid].num_prompt_tokens
            ]  # fmt: skip
            fields: dict[str, Any] = {
                "req_ids": ids,
                "sampled_token_ids": [[7] if rid in done else [] for rid in ids],
            }
            if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:
                fields["req_id_to_index"] = {rid: i for i, rid in enumerate(ids)}  # 0.33
            result = ModelRunnerOutput(**fields)
            self.scheduler.update_from_output(out, result)
            if request.request_id not in self.scheduler.requests:
                return int(cached or 0)
        raise RuntimeError(f"request {request.request_id} did not finish in 64 steps")


def prompt(seed: int, length: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 240000 + 10 for i in range(length)]


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    saved = dict(os.environ)
    os.environ.update(case.get("env", {}))
    try:
        config, kv_config = build(case)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    engine = Engine(config, kv_config)
    result: dict[str, Any] = dict(engine.blocks, repeated={}, shared={})
    for n, length in enumerate(REPEATED):
        tokens = prompt(100 + n, length)
        engine.serve(tokens)
        result["repeated"][str(length)] = engine.serve(tokens)
    for n, (shared, tail) in enumerate(SHARED):
        common = prompt(200 + n, shared)
        engine.serve(common + prompt(300 + n, tail))
        result["shared"][str(shared)] = engine.serve(common + prompt(400 + n, tail))
    return result


def main() -> None:
    cases = json.loads(sys.argv[1])
    out = {name: run_case(case) for name, case in cases.items()}
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
