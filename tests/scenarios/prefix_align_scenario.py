"""The design note's failing layout, built with the vLLM that is first on sys.path.

Run as a script (tests put a vLLM source tree on PYTHONPATH); writes one JSON object to the
path given as its argument (vLLM logs to stdout, so stdout is not ours).
Target: Qwen3.5-122B-A10B geometry, 36 GatedDeltaNet (Mamba, align mode) + 12 attention
layers, both scaled by page-size unification from 2240 to 4480 tokens per block. Drafter:
6 DFlash attention layers left at 2240 tokens, whose per-token page is twice the target's.
All three kinds of page are then 9,175,040 bytes, so vLLM groups them by uniform page size.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sparkserve.memory.kv import cpu_platform_keeps_triton

# vLLM 0.34's CPU platform wants Triton on x86: the planner's step, before vLLM decides it
cpu_platform_keeps_triton()

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, VllmConfig  # noqa: E402
from vllm.v1 import kv_cache_interface as kvi  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator  # noqa: E402

ATTENTION_BLOCK = 2240  # what Mamba align mode gives the target on a Spark (FACTS.md)
SCALED_BLOCK = 2 * ATTENTION_BLOCK
TARGET_LAYERS, FULL_ATTENTION_EVERY, DRAFT_LAYERS = 48, 4, 6


def kv_cache_groups(config: VllmConfig, specs: dict[str, kvi.KVCacheSpec]) -> list:
    try:  # 0.28+ moved the grouping into kv_cache_planning
        from vllm.v1.core.kv_cache_planning import get_kv_cache_groups
    except ImportError:
        get_kv_cache_groups = kv_cache_utils.get_kv_cache_groups
    return get_kv_cache_groups(config, specs)


def main() -> None:
    cache = CacheConfig(
        block_size=ATTENTION_BLOCK, enable_prefix_caching=True, mamba_cache_mode="align"
    )
    config = VllmConfig(cache_config=cache, device_config=DeviceConfig(device="cpu"))
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    if getattr(cache, "kv_cache_layout", "") is None:
        cache.kv_cache_layout = "NHD"  # 0.33 reads it while grouping

    target_attention = kvi.FullAttentionSpec(
        block_size=SCALED_BLOCK, num_kv_heads=2, head_size=256, dtype=torch.bfloat16
    )
    drafter_attention = kvi.FullAttentionSpec(
        block_size=ATTENTION_BLOCK, num_kv_heads=8, head_size=128, dtype=torch.bfloat16
    )
    page = target_attention.page_size_bytes
    gated_delta_net = kvi.MambaSpec(
        block_size=SCALED_BLOCK,
        shapes=((3, 8192), (16, 128, 128)),  # conv and recurrent state of one GDN layer
        dtypes=(torch.bfloat16, torch.float32),
        page_size_padded=page,
        mamba_cache_mode="align",
    )
    specs: dict[str, kvi.KVCacheSpec] = {}
    for layer in range(TARGET_LAYERS):
        if layer % FULL_ATTENTION_EVERY == FULL_ATTENTION_EVERY - 1:
            specs[f"model.layers.{layer}.self_attn.attn"] = target_attention
        else:
            specs[f"model.layers.{layer}.linear_attn"] = gated_delta_net
    for layer in range(DRAFT_LAYERS):
        specs[f"draft_model.layers.{layer}.self_attn.attn"] = drafter_attention

    groups = kv_cache_groups(config, specs)
    kv_cache_config = kvi.KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)
    scheduler_block, hash_block = kv_cache_utils.resolve_kv_cache_block_sizes(
        kv_cache_config, config
    )
    result: dict[str, object] = {
        "vllm_version": vllm.__version__,
        "vllm_file": vllm.__file__,
        "pages": sorted({s.page_size_bytes for s in specs.values()}),
        "groups": [[type(g.kv_cache_spec).__name__, g.kv_cache_spec.block_size] for g in groups],
        "scheduler_block_size": scheduler_block,
        "hash_block_size": hash_block,
    }
    try:
        coordinator = HybridKVCacheCoordinator(
            kv_cache_config,
            262144,  # max_model_len
            8192,  # max_in_flight_tokens
            False,  # use_eagle
            True,  # enable_caching
            False,  # enable_kv_cache_events
            dcp_world_size=1,
            pcp_world_size=1,
            scheduler_block_size=scheduler_block,
            hash_block_size=hash_block,
        )
        result["coordinator"] = "built"
        result["coordinator_hash_block_size"] = coordinator.hash_block_size
    except AssertionError as error:
        result["coordinator"] = f"AssertionError: {error}"
    Path(sys.argv[1]).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
