"""Every knob a launcher reads, as its type: one attribute per knob, declared from the
registry (`sparkserve knobs sync` writes the block below; the tests fail on drift).

`launch.settings.Settings.values` holds one, parsed once when the settings are resolved, so
no tool parses a knob's text again. An attribute is None for an empty number (unset: vLLM or
GPU_MEM decides) and where this launcher does not read the knob.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from sparkserve.knobs.registry import BY_NAME


@dataclass(frozen=True)
class KnobValues:
    # >>> knobs: generated from sparkserve/knobs/registry.py by `sparkserve knobs sync`
    RECIPE: str
    MODEL: str
    DRAFT_MODEL: str | None
    SERVED_MODEL_NAME: str
    NUM_SPEC_TOKENS: int
    SPEC_METHOD: str
    DRAFT_ATTENTION_BACKEND: str | None
    LOAD_FORMAT: str
    TOOL_PARSER: str
    REASONING_PARSER: str
    THINKING: bool
    GPU_MEM: float
    OS_RESERVE_GB: float
    MAX_MODEL_LEN: int
    KV_CACHE_GB: float | None
    MAX_NUM_SEQS: int
    MAX_BATCHED_TOKENS: int
    PREFIX_CACHE: bool
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS: bool
    SPARK_KEEP_BF16_LMHEAD: bool
    SPARK_LMHEAD_CALIBRATE: str
    GUARD: bool
    GUARD_FLOOR_GB: float | None
    GUARD_SWAP_MB_S: float
    GUARD_PSI_PCT: float
    GUARD_RESUME: bool
    HOST: str
    PORT: int
    API_KEY: str
    METRICS_OPEN: bool
    MAX_REQUEST_MB: int
    HF_TOKEN: str
    HF_HOME: str
    HF_OFFLINE: bool
    BIND_ADDRESS: str
    ALLOWED_HOSTS: str
    ALLOWED_ORIGINS: str
    CLUSTER_NODES: int
    CLUSTER_RANK: int
    CLUSTER_HEAD_ADDR: str
    CLUSTER_IFACE: str
    CLUSTER_IB_HCA: str
    CLUSTER_LAYOUT: str
    CLUSTER_PORT: int
    CLUSTER_WATCH_PORT: int
    CLUSTER_SECRET: str
    CLUSTER_PEER_TIMEOUT_S: float
    CLUSTER_JOIN_TIMEOUT_S: float
    SHUTDOWN_TIMEOUT_S: int
    EXTRA_ARGS: str
    DRY_RUN: str
    # <<< knobs

    @classmethod
    def parse(cls, text: Mapping[str, str]) -> KnobValues:
        """From each knob's checked text (`Knob.check`); a knob missing from `text` (one
        this launcher does not read) is None."""
        return cls(
            **{
                field.name: BY_NAME[field.name].value(text[field.name])
                if field.name in text
                else None
                for field in fields(cls)
            }
        )
