"""The replicas behind the router, seen from the router's host: does each answer, what does it
serve and with which settings, and which one differs from the others (`sparkserve doctor
--fleet`).

A replica is read only through what a running vLLM server already shows over HTTP, with the
API key: GET /health (does it answer), /v1/models (the served name, the checkpoint it was
loaded from, max_model_len), /version (the vLLM release) and /metrics (the
`vllm:cache_config_info` labels: block size, prefix caching, cache dtypes, memory share...;
the speculative tokens per step, counted from the spec-decode counters' positions). What a
pair of nodes compares besides (cluster.identity: the image, torch, the sparkserve build) is
not served over HTTP, and neither are the drafter or the quantization: not compared.

Each field is judged against the value most replicas that answered have (a tie goes to the
earliest replica in the list), so one odd replica of three is the one named.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sparkserve.client import metrics

DEFAULT_TIMEOUT_S = 5.0
MAX_PARALLEL = 16  # replicas probed at once
HEALTH_PATH = "/health"
MODELS_PATH = "/v1/models"
VERSION_PATH = "/version"
METRICS_PATH = "/metrics"
SPECULATIVE = "speculative_tokens"
# Fields from the API, in the order a difference is reported; the cache labels follow.
API_FIELDS = ("model", "root", "max_model_len", "vllm", SPECULATIVE)
# vllm:cache_config_info labels that measure this machine's KV pool (free memory at start,
# the pool over max_model_len) or name the engine: they differ between healthy replicas.
POOL_TOKENS = "kv_cache_size_tokens"
POOL_LABELS = frozenset(
    {"engine", "num_gpu_blocks", "num_cpu_blocks", POOL_TOKENS, "kv_cache_max_concurrency"}
)
COMPARED = (
    "the served model name, root and max_model_len (/v1/models), the vLLM release (/version), "
    "the speculative tokens per step and every vllm:cache_config_info label but the KV pool's "
    "size (/metrics)"
)
NOT_COMPARED = (
    "the image, torch, the sparkserve build, the drafter and the quantization (not shown over HTTP)"
)
ABSENT = "absent"


class ProbeFailed(Exception):
    """One replica could not be read; the message says why in one line."""


class NoAnswer(ProbeFailed):
    """No HTTP answer came at all (refused, timed out, closed)."""


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: str


@dataclass(frozen=True)
class Replica:
    """What one replica showed: its settings (field -> value as text), or why not."""

    url: str
    problem: str | None = None
    settings: Mapping[str, str] = field(default_factory=dict)
    pool_tokens: str | None = None
    # Not ready or not answering (its /health, or no answer on a later route): what the
    # router's own health checks see; not a replica that answered and differs.
    out_of_reach: bool = False


@dataclass(frozen=True)
class Difference:
    field: str
    here: str
    fleet: str

    def __str__(self) -> str:
        return f"{self.field}: here {self.here}, fleet {self.fleet}"


@dataclass(frozen=True)
class Verdict:
    """One replica judged: ok, or the problem / the fields that differ."""

    url: str
    ok: bool
    detail: str
    differences: tuple[Difference, ...] = ()
    out_of_reach: bool = False


def _why(error: BaseException) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (nothing listens there: stopped?)"
    if isinstance(error, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(error, http.client.RemoteDisconnected | ConnectionResetError):
        return "the connection was closed without an answer"
    return (str(error) or type(error).__name__).splitlines()[0]


def get(url: str, path: str, key: str, timeout_s: float) -> Reply:
    """GET `path` of the replica at `url` (normalised: scheme://host:port), with the key as
    Bearer when there is one; ProbeFailed when no HTTP answer came."""
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname or "", parts.port, timeout=timeout_s)
    headers = {"Accept": "*/*"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse()
        body = answer.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as error:
        raise NoAnswer(f"unreachable: GET {path}: {_why(error)}") from None
    finally:
        conn.close()
    return Reply(answer.status, answer.getheader("Content-Type", ""), body)


def _refused(url: str, path: str, reply: Reply, key: str) -> str:
    """One line for an answer other than 200."""
    if reply.status == 401 and path == HEALTH_PATH:
        return (
            f"HTTP 401 on {path} without a key: the router's health checks send none, so it "
            "would take this replica out of rotation (not a sparkserve replica?)"
        )
    if reply.status == 401:
        whose = "no API_KEY is set here" if not key else "the API_KEY here is not this replica's"
        return f"HTTP 401 on {path}: {whose}"
    if reply.status == 421:
        host = urllib.parse.urlsplit(url).hostname
        return (
            f"HTTP 421 on {path}: the replica refuses the host name {host!r} "
            "(its BIND_ADDRESS or ALLOWED_HOSTS must name it)"
        )
    if path == HEALTH_PATH and reply.status == 503:
        return f"not ready: {path} answered HTTP 503 (starting, stopping, or its engine failed)"
    text = " ".join(reply.body.split())[:120]
    return f"HTTP {reply.status} on {path}: {text}"


def _ok(url: str, path: str, key: str, timeout_s: float) -> Reply:
    reply = get(url, path, key, timeout_s)
    if reply.status != 200:
        raise ProbeFailed(_refused(url, path, reply, key))
    return reply


def _json(url: str, path: str, key: str, timeout_s: float) -> object:
    reply = _ok(url, path, key, timeout_s)
    try:
        return json.loads(reply.body)
    except json.JSONDecodeError:
        raise ProbeFailed(f"{path} is not JSON: {reply.body[:80]!r} (not a vLLM server?)") from None


def served_models(document: object) -> dict[str, str]:
    """model, root and max_model_len from a /v1/models answer (its base models, not
    adapters; several are joined by commas in id order)."""
    entries = document.get("data") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ProbeFailed(f"{MODELS_PATH} has no model list (not a vLLM server?)")
    base = sorted(
        (entry for entry in entries if isinstance(entry, dict) and not entry.get("parent")),
        key=lambda entry: str(entry.get("id")),
    )
    if not base:
        raise ProbeFailed(f"{MODELS_PATH} lists no model")
    return {
        name: ",".join(str(entry.get(name, ABSENT)) for entry in base)
        for name in ("id", "root", "max_model_len")
    }


def metric_settings(snapshot: metrics.Snapshot) -> tuple[dict[str, str], str | None]:
    """(the speculative tokens and the cache_config_info labels but the pool's, the pool's
    size in tokens) from one /metrics snapshot; the first engine's labels."""
    infos = sorted(dict(pairs) for name, pairs in snapshot if name == metrics.CACHE_INFO)
    labels = min(infos, key=lambda info: info.get("engine", ""), default={})
    positions = metrics.by_label(snapshot, metrics.ACCEPTED_PER_POS, "position")
    found = {SPECULATIVE: str(len(positions))}
    found |= {name: value for name, value in sorted(labels.items()) if name not in POOL_LABELS}
    return found, labels.get(POOL_TOKENS)


def probe(url: str, key: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Replica:
    """Read one replica: /health first (does it answer at all), then what it serves."""
    try:
        _ok(url, HEALTH_PATH, "", timeout_s)  # /health takes no key (in_vllm.access)
    except ProbeFailed as failure:
        return Replica(url, problem=str(failure), out_of_reach=True)
    try:
        models = served_models(_json(url, MODELS_PATH, key, timeout_s))
        version = _json(url, VERSION_PATH, key, timeout_s)
        text = _ok(url, METRICS_PATH, key, timeout_s).body
    except ProbeFailed as failure:
        return Replica(url, problem=str(failure), out_of_reach=isinstance(failure, NoAnswer))
    from_metrics, pool = metric_settings(metrics.parse(text))
    settings = {
        "model": models["id"],
        "root": models["root"],
        "max_model_len": models["max_model_len"],
        "vllm": str(version.get("version", ABSENT)) if isinstance(version, dict) else ABSENT,
        **from_metrics,
    }
    return Replica(url, settings=settings, pool_tokens=pool)


def reference(replicas: Sequence[Replica]) -> dict[str, str]:
    """Per field, the value most replicas that answered have; a tie goes to the earliest."""
    answered = [replica.settings for replica in replicas if replica.problem is None]
    if not answered:
        return {}
    names = list(API_FIELDS) + sorted({n for s in answered for n in s} - set(API_FIELDS))
    chosen = {}
    for name in names:
        values = [settings.get(name, ABSENT) for settings in answered]
        counts = Counter(values)
        chosen[name] = max(values, key=lambda value: (counts[value], -values.index(value)))
    return chosen


def _summary(replica: Replica) -> str:
    s = replica.settings
    pool = f"; KV pool {replica.pool_tokens} tokens" if replica.pool_tokens else ""
    return (
        f"serves {s['model']} ({s['root']}, max_model_len {s['max_model_len']}), "
        f"vLLM {s['vllm']}, block_size {s.get('block_size', ABSENT)}, prefix caching "
        f"{s.get('enable_prefix_caching', ABSENT)}, speculative tokens {s[SPECULATIVE]}{pool}"
    )


def judge(replicas: Sequence[Replica]) -> list[Verdict]:
    """Each replica against the fleet's reference values, in the order given."""
    fleet = reference(replicas)
    verdicts = []
    for replica in replicas:
        if replica.problem is not None:
            verdicts.append(
                Verdict(replica.url, False, replica.problem, out_of_reach=replica.out_of_reach)
            )
            continue
        differences = tuple(
            Difference(name, replica.settings.get(name, ABSENT), value)
            for name, value in fleet.items()
            if replica.settings.get(name, ABSENT) != value
        )
        if differences:
            detail = "differs: " + "; ".join(str(d) for d in differences)
            verdicts.append(Verdict(replica.url, False, detail, differences))
        else:
            verdicts.append(Verdict(replica.url, True, _summary(replica)))
    return verdicts


def check_fleet(
    urls: Sequence[str], key: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[Verdict]:
    """Probe every replica at once (an unreachable one costs its timeout, not N of them)."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(urls), MAX_PARALLEL))) as pool:
        replicas = list(pool.map(lambda url: probe(url, key, timeout_s), urls))
    return judge(replicas)
