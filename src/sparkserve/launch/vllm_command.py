"""vLLM's whole command line and environment, decided in one place from the resolved settings.

The launchers exec exactly what `vllm_command` returns (through `sparkserve start`);
`DRY_RUN=1` prints it. Besides the settings it needs three facts about this machine: the
installed vLLM's release (for the workarounds), whether the target is hybrid (from its
config.json: the Mamba flags apply to hybrid targets only) and, on a pair, this node's address
on the link.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass

from sparkserve.launch.settings import Settings
from sparkserve.launch.shell import shell_quote
from sparkserve.launch.versions import parse_release
from sparkserve.launch.workarounds import WORKAROUNDS

SECRET_ENV = ("VLLM_API_KEY", "HF_TOKEN")
# The names the access middleware answers to besides loopback (sparkserve.in_vllm.access).
HOSTS_ENV = "SPARKSERVE_ALLOWED_HOSTS"
WILDCARDS = frozenset({"0.0.0.0", "::", "[::]", ""})  # bind everywhere: no name to be asked by
ACCESS_MIDDLEWARE = "sparkserve.in_vllm.access.RequireKey"
ACCESS_THEN_DRAIN = "sparkserve.in_vllm.access.RequireKeyThenDrain"
# THINKING=0: the chat template renders no thinking and vLLM's reasoning parsers start in the
# answer (the same switch a request's chat_template_kwargs turns).
NO_THINKING = {"enable_thinking": False}


# From vLLM 0.34, on CUDA, the KV pool is sized after warm-up from the memory found free (the
# "extensible KV cache") unless its size is given, and GPU_MEM is only a cap. The launchers keep
# GPU_MEM a budget, so OS_RESERVE_GB holds as planned, until that is measured on unified memory
# (docs/UPGRADING.md).
EXTENSIBLE_KV_CACHE_FROM = (0, 34)
KEEP_GPU_MEM_A_BUDGET = (
    "vLLM 0.34 would size the KV pool from the memory free after warm-up and take GPU_MEM as a "
    "cap (its extensible KV cache): keeping GPU_MEM a budget (--no-enable-extensible-kv-cache) "
    "until that is measured on unified memory"
)


@dataclass(frozen=True)
class VllmCommand:
    argv: tuple[str, ...]  # after `vllm serve`
    env: dict[str, str]  # exported for vLLM (secrets included)
    notes: tuple[str, ...]  # the workarounds' reasons, for the launcher to print

    def shown_env(self) -> list[str]:
        """The environment as a dry run prints it, NAME='value' (shell-quoted), secrets
        hidden."""
        return [
            f"{k}=<hidden>" if k in SECRET_ENV and v else f"{k}={shell_quote(v)}"
            for k, v in self.env.items()
        ]


def speculative_config(settings: Settings, extra: dict[str, object]) -> str:
    """The --speculative-config JSON of the launcher's drafter, with the workarounds' fields."""
    text = settings.text  # vLLM's argv and environment: the knobs' text
    config: dict[str, object]
    if text["SPEC_METHOD"] == "ngram":
        # vLLM's prompt lookup: drafts follow the latest match of 2 to 4 tokens. The launcher's
        # workaround fields concern its own drafter, so none is added.
        config = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}
        config["num_speculative_tokens"] = settings.values.NUM_SPEC_TOKENS
        return json.dumps(config, separators=(",", ":"))
    if settings.launcher == "dflash":
        config = {"method": "dflash", "model": text["DRAFT_MODEL"]}
    else:
        config = {"method": "mtp"}
    config["num_speculative_tokens"] = settings.values.NUM_SPEC_TOKENS
    if settings.launcher == "dflash" and text["DRAFT_ATTENTION_BACKEND"]:
        config["attention_backend"] = text["DRAFT_ATTENTION_BACKEND"]
    config |= extra
    return json.dumps(config, separators=(",", ":"))


def cluster_args(settings: Settings, join_timeout_s: int) -> list[str]:
    """vLLM's native multi-node launch (multiprocessing executor: vLLM's CPU build refuses Ray,
    docs/CLUSTER.md). Both nodes get the same command but for --node-rank; the worker runs
    headless. vLLM's own rendezvous and collectives give up after the join timeout instead of
    torch's 30 min. The options, in vLLM's parser: --nnodes/--node-rank/--master-addr/
    --master-port and --distributed-timeout-seconds in `EngineArgs.add_cli_args`
    (engine/arg_utils.py), --headless in `make_arg_parser` (entrypoints/common/cli_args.py
    from 0.33); tests/launch/test_launchers.py parses them with the pinned and the next release."""
    text = settings.text  # vLLM's argv and environment: the knobs' text
    if not settings.pair:
        return []
    args = [
        "--nnodes", "2", "--node-rank", text["CLUSTER_RANK"],
        "--master-addr", text["CLUSTER_HEAD_ADDR"], "--master-port", text["CLUSTER_PORT"],
        "--distributed-executor-backend", "mp",
        "--distributed-timeout-seconds", str(join_timeout_s),
    ]  # fmt: skip
    if text["CLUSTER_LAYOUT"] == "pp":
        args += ["--pipeline-parallel-size", "2"]
    else:
        args += ["--tensor-parallel-size", "2"]
    if settings.values.CLUSTER_RANK == 1:
        args.append("--headless")
    return args


def drain_args(settings: Settings) -> list[str]:
    """How a SIGTERM stops vLLM, and who reaches it: the requests in flight get
    SHUTDOWN_TIMEOUT_S to finish (0: aborted at once), new ones HTTP 503 meanwhile
    (sparkserve.in_vllm.draining); the key on every route but the open ones and the body limit
    on every server (sparkserve.in_vllm.access), checked first. One --middleware: vLLM 0.32 and
    0.33 log "Found duplicate keys --middleware" for a second one (it keeps both), so one class
    holds both when the drain is on. Every release the project runs has both options, so no
    release gates them: --shutdown-timeout in engine/arg_utils.py (0.27.1: line 1643; 0.32: 1902;
    0.33: 1941), --middleware in entrypoints/openai/cli_args.py (0.27.1: line 301) and
    entrypoints/launchers/cli_args.py (0.32: 351; 0.33: 361)."""
    text = settings.text  # vLLM's argv and environment: the knobs' text
    middleware = ACCESS_THEN_DRAIN if settings.values.SHUTDOWN_TIMEOUT_S > 0 else ACCESS_MIDDLEWARE
    return ["--shutdown-timeout", text["SHUTDOWN_TIMEOUT_S"], "--middleware", middleware]


def allowed_hosts(settings: Settings) -> str:
    """SPARKSERVE_ALLOWED_HOSTS: the addresses the server is configured on (BIND_ADDRESS, HOST;
    wildcards dropped) and ALLOWED_HOSTS' names, or "*" when that knob says so."""
    text = settings.text  # vLLM's argv and environment: the knobs' text
    if text["ALLOWED_HOSTS"] == "*":
        return "*"
    names = [text["BIND_ADDRESS"], text["HOST"], *text["ALLOWED_HOSTS"].split(",")]
    return ",".join(dict.fromkeys(name for name in names if name not in WILDCARDS))


def origin_args(settings: Settings) -> list[str]:
    """The pages a browser lets call the API (vLLM's CORS list): ALLOWED_ORIGINS as vLLM's
    --allowed-origins takes it, a JSON list (entrypoints/launchers/cli_args.py). Given always,
    empty too: vLLM 0.32 and 0.34 default to none, but 0.27.1 to "*", every page
    (entrypoints/openai/cli_args.py:277), so the knob decides whatever the release."""
    text = settings.text  # vLLM's argv and environment: the knobs' text
    origins = [origin for origin in text["ALLOWED_ORIGINS"].split(",") if origin]
    return ["--allowed-origins", json.dumps(origins)]


def join_timeout_s(settings: Settings) -> int:
    return math.ceil(settings.values.CLUSTER_JOIN_TIMEOUT_S)


def start_caches(hf_home: str) -> dict[str, str]:
    """Where the caches a start fills go: under HF_HOME, the model-cache volume, so that a
    recreated container (a new image, `compose down` and `up`) starts warm. Outside the volume
    a container's own layer holds them and loses them. vLLM keeps its torch.compile artefacts
    under VLLM_CACHE_ROOT and points inductor (and Triton, when the caller names no Triton
    cache) into its per-model folder only while it compiles (compilation/compiler_interface.py,
    initialize_inductor_cache, and compilation/decorators.py in 0.33); every kernel launched
    before or beside that (GatedDeltaNet's Triton kernels, the int8 head's) JIT-compiles into
    Triton's default ~/.triton/cache, 3.6 MB after one start on an H200 (FACTS). Not moved:
    what torch keeps in tempfile's folder (/tmp/torchinductor_<user>) on purpose, whatever
    TORCHINDUCTOR_CACHE_DIR says (torch/_inductor/codecache.py: the C++ precompiled headers;
    cache.py: its on-disk caches); vLLM's compiled graphs are not among them."""
    return {
        "VLLM_CACHE_ROOT": f"{hf_home}/vllm",
        # Triton's JIT cache (triton/knobs.py: TRITON_CACHE_DIR), and with it the autotuning
        # results vLLM asks Triton to keep (env_override.py: TRITON_CACHE_AUTOTUNING=1)
        "TRITON_CACHE_DIR": f"{hf_home}/triton",
        # FlashInfer's JIT-built kernels: <base>/.cache/flashinfer (default base: ~)
        "FLASHINFER_WORKSPACE_BASE": f"{hf_home}/flashinfer",
        # the CUDA driver's PTX-to-SASS cache (default ~/.nv/ComputeCache): kernels shipped as
        # PTX only for a newer GPU than they were built for (sm_121) compile at their first load
        "CUDA_CACHE_PATH": f"{hf_home}/nv-compute-cache",
    }


def vllm_env(settings: Settings, host_ip: str) -> dict[str, str]:
    text = settings.text  # vLLM's argv and environment: the knobs' text
    env = {
        "HF_HOME": text["HF_HOME"],
        **start_caches(text["HF_HOME"]),
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": text[
            "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"
        ],
        "SPARK_KEEP_BF16_LMHEAD": text["SPARK_KEEP_BF16_LMHEAD"],
        "SPARK_LMHEAD_CALIBRATE": text["SPARK_LMHEAD_CALIBRATE"],
        # the rows the int8 head serves at most, for the plugin where vLLM's config has no
        # scheduler settings (sparkserve.in_vllm.lmhead.plugin.max_rows): this launch's, not a
        # default
        "SPARKSERVE_LMHEAD_ROWS": str(settings.lmhead_rows),
        # read by the access middleware inside vLLM (sparkserve.in_vllm.access)
        "METRICS_OPEN": text["METRICS_OPEN"],
        "MAX_REQUEST_MB": text["MAX_REQUEST_MB"],
        HOSTS_ENV: allowed_hosts(settings),
        # the fetch step has put every checkpoint into the cache: vLLM never downloads
        "HF_HUB_OFFLINE": "1",
    }
    if text["API_KEY"]:
        # through the environment, so that the key never shows in `ps` or in logs
        env["VLLM_API_KEY"] = text["API_KEY"]
    if text["HF_TOKEN"]:
        # vLLM runs offline: the fetch step downloads, with the token. The launcher's own
        # environment still holds it (the fetch reads it there): blanked for vLLM, which
        # huggingface_hub reads as no token.
        env["HF_TOKEN"] = ""
    if settings.pair:
        # The address this node announces to the other (vLLM envs.py, VLLM_HOST_IP; otherwise
        # vLLM guesses from the default route, which is not the ConnectX-7 link).
        env["VLLM_HOST_IP"] = host_ip
        # The interface torch.distributed's Gloo backend binds to (PyTorch docs,
        # torch.distributed: "Choosing the network interface to use").
        env["GLOO_SOCKET_IFNAME"] = text["CLUSTER_IFACE"]
        # The interface NCCL's bootstrap and socket transport use (NCCL docs: NCCL_SOCKET_IFNAME).
        env["NCCL_SOCKET_IFNAME"] = text["CLUSTER_IFACE"]
        if text["CLUSTER_IB_HCA"]:
            # The RoCE devices NCCL's RDMA transport uses (NCCL docs: NCCL_IB_HCA); on a Spark
            # both halves of the cabled port give the full 200 Gb/s (docs/CLUSTER.md).
            env["NCCL_IB_HCA"] = text["CLUSTER_IB_HCA"]
    return env


def memory_args(settings: Settings, vllm_version: str) -> tuple[list[str], list[str]]:
    """The KV pool's budget: GPU_MEM, KV_CACHE_GB's bytes when set, and on a release with the
    extensible KV cache the flag that keeps GPU_MEM a budget; and the note to print."""
    text = settings.text  # vLLM's argv and environment: the knobs' text
    argv = ["--gpu-memory-utilization", text["GPU_MEM"]]
    if settings.kv_cache_bytes is not None:
        return [*argv, "--kv-cache-memory-bytes", str(settings.kv_cache_bytes)], []
    try:
        extensible = parse_release(vllm_version)[:2] >= EXTENSIBLE_KV_CACHE_FROM
    except ValueError:
        extensible = False
    if extensible:
        return [*argv, "--no-enable-extensible-kv-cache"], [KEEP_GPU_MEM_A_BUDGET]
    return argv, []


def vllm_command(
    settings: Settings, vllm_version: str, hybrid: bool, host_ip: str = ""
) -> VllmCommand:
    """`vllm serve`'s arguments and environment. EXTRA_ARGS come last, so they can override
    anything before them."""
    text = settings.text  # vLLM's argv and environment: the knobs' text
    argv = [
        "--model", text["MODEL"],
        "--served-model-name", text["SERVED_MODEL_NAME"],
        "--host", text["HOST"],
        "--port", text["PORT"],
    ]  # fmt: skip
    budget, notes = memory_args(settings, vllm_version)
    argv += budget
    argv += [
        "--max-model-len", text["MAX_MODEL_LEN"],
        "--max-num-seqs", text["MAX_NUM_SEQS"],
        "--max-num-batched-tokens", text["MAX_BATCHED_TOKENS"],
        "--load-format", text["LOAD_FORMAT"],
    ]  # fmt: skip
    prefix_cache = settings.values.PREFIX_CACHE
    argv.append("--enable-prefix-caching" if prefix_cache else "--no-enable-prefix-caching")
    if text["TOOL_PARSER"]:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", text["TOOL_PARSER"]]
    if text["REASONING_PARSER"]:
        argv += ["--reasoning-parser", text["REASONING_PARSER"]]
    if not settings.values.THINKING:
        argv += ["--default-chat-template-kwargs", json.dumps(NO_THINKING)]
    argv += drain_args(settings)
    argv += origin_args(settings)
    speculative_fields: dict[str, object] = {}
    for workaround in WORKAROUNDS:
        if workaround.applies(
            vllm_version,
            settings.launcher,
            prefix_cache=prefix_cache,
            speculating=settings.speculating,
            hybrid=hybrid,
        ):
            notes.append(workaround.reason)
            argv += workaround.vllm_args
            speculative_fields |= workaround.speculative_fields
    argv += cluster_args(settings, join_timeout_s(settings))
    if settings.speculating:
        argv += ["--speculative-config", speculative_config(settings, speculative_fields)]
    argv += shlex.split(text["EXTRA_ARGS"])
    return VllmCommand(tuple(argv), vllm_env(settings, host_ip), tuple(notes))
