"""The Grafana dashboard of the metrics profile, written as code: one source, one JSON file.

PANELS says what each panel shows (PromQL over vLLM's, node-exporter's and the guard's
metrics) and what a healthy value looks like, ROUTER_PANELS the same for vLLM's router (the
router profile) in a row of their own; `build()` turns it into a dashboard with
Grafana's official foundation SDK (`grafana-foundation-sdk`, its Grafana 11.6 branch, the
Grafana the compose profile pins). `sparkserve dashboard` writes deploy/metrics/grafana/
dashboards/sparkserve.json; `--check` only reports drift (a test runs it, as for the knobs).
The SDK is needed to generate, not to serve: the image does not carry it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
OUTPUT = Path("deploy/metrics/grafana/dashboards/sparkserve.json")
DATASOURCE_UID = "sparkserve-prometheus"  # deploy/metrics/grafana/provisioning/datasources
DASHBOARD_UID = "sparkserve"
RATE = "$__rate_interval"  # Grafana's window: at least four scrape intervals


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str
    idle: bool = False  # a "no traffic" marker: 0 while the server is idle, else no value


@dataclass(frozen=True)
class PanelSpec:
    title: str
    healthy: str  # the panel's description: what it shows and what is healthy on a Spark
    unit: str
    queries: tuple[Query, ...]
    minimum: float | None = 0.0
    maximum: float | None = None


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    query: str  # Grafana's label_values() over the data source


# One server is one vLLM scrape target (instance) serving one model; one host is one
# node-exporter target. Every panel keeps them apart (by instance, by model), so a pair's two
# hosts or two servers on one host are never summed or maxed into one line.
VARIABLES = (
    Variable("instance", "vLLM server", 'label_values(up{job="vllm"}, instance)'),
    Variable(
        "model",
        "model",
        'label_values(vllm:num_requests_running{instance=~"$instance"}, model_name)',
    ),
    Variable("host", "host", "label_values(node_memory_MemAvailable_bytes, instance)"),
    Variable("router", "router", 'label_values(up{job="router"}, instance)'),
    Variable("gate", "router gate", 'label_values(up{job="router_gate"}, instance)'),
)
SERVER = '{instance=~"$instance", model_name=~"$model"}'
HOST = '{instance=~"$host"}'
BY = "instance, model_name"
WHO = "{{instance}} {{model_name}}"


def _rate(metric: str, by: str = BY) -> str:
    return f"sum by ({by}) (rate({metric}{SERVER}[{RATE}]))"


def _no_traffic(denominator: str) -> Query:
    """0 while the denominator's rate is 0 (an idle server), no value otherwise: an idle
    server shows as idle, and a broken one (no series at all) as a gap."""
    return Query(f"{denominator} == 0", f"{WHO}: no traffic", idle=True)


def _ratio(
    numerator: str, denominator: str, legend: str, plus_one: bool = False
) -> tuple[Query, ...]:
    """numerator / denominator where the denominator moved, and the idle marker."""
    head = "1 + " if plus_one else ""
    return (
        Query(f"({head}{numerator} / {denominator}) and {denominator} > 0", legend),
        _no_traffic(denominator),
    )


def _p50_p95(histogram: str) -> tuple[Query, ...]:
    """The median and the 95th percentile of a vLLM histogram over the rate window, per
    server, where requests were observed; the idle marker where none were."""
    observed = _rate(f"{histogram}_count")
    quantiles = tuple(
        Query(
            f"histogram_quantile({q}, {_rate(f'{histogram}_bucket', f'{BY}, le')}) "
            f"and on ({BY}) {observed} > 0",
            f"{WHO}: {name}",
        )
        for q, name in ((0.5, "p50"), (0.95, "p95"))
    )
    return (*quantiles, _no_traffic(observed))


DRAFTS = _rate("vllm:spec_decode_num_drafts_total")
PER_POSITION = f"{BY}, position"
# sparkserve.in_vllm.spec_metrics (the plugin) counts the drafts that had a token at each position.
REACHED = _rate("sparkserve_spec_decode_num_drafts_per_pos_total", PER_POSITION)
# The guard rewrites its state every second while it watches; older than this is stale.
GUARD_FRESH_S = 30

PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(
        "Decode tokens/s",
        "Generated tokens per second, per server and model (0 while idle). A Spark with the "
        "default DFlash drafter gives ~81 tok/s on agent turns, 54.5 on code, 33 on prose at one "
        "stream (published figures); without a drafter ~28.",
        "short",
        (Query(_rate("vllm:generation_tokens_total"), f"{WHO}: generated"),),
    ),
    PanelSpec(
        "Time to first token",
        "p50 and p95 of the time from request to first token; 'no traffic' (0) while no "
        "request started. Warm prefixes (cache hits) should start in a fraction of a second "
        "(0.18 s on a 4k prefix on a Spark); a cold long prompt takes seconds.",
        "s",
        _p50_p95("vllm:time_to_first_token_seconds"),
    ),
    PanelSpec(
        "Inter-token latency",
        "p50 and p95 of the time between streamed tokens; 'no traffic' (0) while nothing "
        "streams. With a drafter tokens arrive in bursts of accepted drafts, so p50 is small "
        "and p95 is one verification step; a p95 rising under load means the batch is "
        "saturated.",
        "s",
        _p50_p95("vllm:inter_token_latency_seconds"),
    ),
    PanelSpec(
        "Requests running and waiting",
        "Requests in the batch and in the queue, per server. Running stays at or under "
        "MAX_NUM_SEQS (3); waiting above 0 for long means more clients than the server runs at "
        "once.",
        "short",
        (
            Query(f"sum by ({BY}) (vllm:num_requests_running{SERVER})", f"{WHO}: running"),
            Query(f"sum by ({BY}) (vllm:num_requests_waiting{SERVER})", f"{WHO}: waiting"),
        ),
    ),
    PanelSpec(
        "KV cache usage",
        "Share of the KV pool in use, per server (its fullest engine). Near 100 % with requests "
        "waiting means the pool, not the compute, limits concurrency; a full pool preempts "
        "requests.",
        "percentunit",
        (Query(f"max by ({BY}) (vllm:kv_cache_usage_perc{SERVER})", f"{WHO}: KV pool used"),),
        maximum=1.0,
    ),
    PanelSpec(
        "Prefix-cache hit rate",
        "Prompt tokens served from cached blocks over tokens looked up; 'no traffic' (0) while "
        "no prompt arrives. Multi-turn chat and agents should hit well above half; 0 while "
        "prompts arrive is the known failure of drafters on hybrid models (vLLM #51250) or "
        "prompts that diverge inside the cache.",
        "percentunit",
        _ratio(
            _rate("vllm:prefix_cache_hits_total"),
            _rate("vllm:prefix_cache_queries_total"),
            f"{WHO}: hit rate",
        ),
        maximum=1.0,
    ),
    PanelSpec(
        "Mean acceptance length",
        "Tokens per verification step: 1 + accepted draft tokens / drafts; 'no traffic' (0) "
        "while nothing is drafted. DFlash on a Spark: ~7.7 on code, 8.3-8.7 on agent turns, "
        "~2.3 on prose; 1.0 means the drafter earns nothing.",
        "short",
        _ratio(_rate("vllm:spec_decode_num_accepted_tokens_total"), DRAFTS, f"{WHO}: mean", True),
    ),
    PanelSpec(
        "Acceptance per draft position",
        "Of the drafts that had a token at this position, the share whose token was accepted "
        "(a drafter that proposed fewer tokens is not counted as rejected: the denominator is "
        "sparkserve's plugin counter, sparkserve_spec_decode_num_drafts_per_pos); 'no traffic' "
        "(0) while nothing is drafted. It falls with the position; a curve that drops to 0 "
        "after position k says NUM_SPEC_TOKENS above k only costs compute.",
        "percentunit",
        (
            Query(
                f"({_rate('vllm:spec_decode_num_accepted_tokens_per_pos_total', PER_POSITION)}"
                f" / {REACHED}) and {REACHED} > 0",
                f"{WHO}: position {{{{position}}}}",
            ),
            _no_traffic(DRAFTS),
        ),
        maximum=1.0,
    ),
    PanelSpec(
        "Host MemAvailable, OS reserve and guard floor",
        "Per host: MemAvailable must stay above OS_RESERVE_GB (14 GiB; ~15 GiB is left under "
        "peak 3-stream load at GPU_MEM 0.82 on a Spark). At the guard's floor (half the "
        "reserve) the guard stops vLLM if it stays 3 s, at half of it at once.",
        "bytes",
        (
            Query(f"node_memory_MemAvailable_bytes{HOST}", "{{instance}}: MemAvailable"),
            Query(f"sparkserve_guard_os_reserve_bytes{HOST}", "{{instance}}: OS reserve"),
            Query(f"sparkserve_guard_floor_bytes{HOST}", "{{instance}}: guard floor"),
        ),
    ),
    PanelSpec(
        "Swap used",
        "Swap in use, per host. Healthy is flat; 0.88 and above swapped on a Spark.",
        "bytes",
        (
            Query(
                f"node_memory_SwapTotal_bytes{HOST} - node_memory_SwapFree_bytes{HOST}",
                "{{instance}}: swap used",
            ),
        ),
    ),
    PanelSpec(
        "Swap growth",
        "How fast swap in use grows, in bytes per second, per host (negative: it shrinks). "
        "Healthy is 0: sustained growth under load is the first sign of a squeeze; the guard "
        "stops vLLM above GUARD_SWAP_MB_S of swap-out.",
        "Bps",
        (
            Query(
                f"-deriv(node_memory_SwapFree_bytes{HOST}[{RATE}])",
                "{{instance}}: swap growth",
            ),
        ),
        minimum=None,
    ),
    PanelSpec(
        "Memory pressure (PSI)",
        "Share of time tasks stalled on memory, per host: some (at least one task) and full "
        "(every task), from the kernel's pressure-stall information, and the guard's own "
        "reading against its limit (GUARD_PSI_PCT). Healthy is near 0; full above a few percent "
        "means the host is reclaiming hard.",
        "percent",
        (
            Query(
                f"rate(node_pressure_memory_waiting_seconds_total{HOST}[{RATE}]) * 100",
                "{{instance}}: some",
            ),
            Query(
                f"rate(node_pressure_memory_stalled_seconds_total{HOST}[{RATE}]) * 100",
                "{{instance}}: full",
            ),
            Query(
                f"sparkserve_guard_psi_full_avg10_percent{HOST}", "{{instance}}: guard: full avg10"
            ),
            Query(f"sparkserve_guard_psi_limit_percent{HOST}", "{{instance}}: guard limit"),
        ),
    ),
    PanelSpec(
        "Memory guard",
        "Per host: 1 while a guard watches vLLM and its state file is fresh (rewritten within "
        f"{GUARD_FRESH_S} s; a file a dead guard left shows 0 here and fires GuardStateStale); "
        "a trip shows 1 on its reason (mem_available, swap_out, psi or oom_kill) and stays until "
        "the next start. A trip means vLLM was stopped: read docs/METRICS.md before "
        "GUARD_RESUME=1.",
        "short",
        (
            Query(
                f"sparkserve_guard_watching{HOST} * on (instance, job) "
                f"(time() - sparkserve_guard_updated_timestamp_seconds{HOST} < bool "
                f"{GUARD_FRESH_S})",
                "{{instance}}: watching",
            ),
            Query(f"sparkserve_guard_tripped{HOST}", "{{instance}}: tripped: {{reason}}"),
        ),
        maximum=1.0,
    ),
)

# vLLM's router (vllm-router, the router profile): one router is one `router` scrape target; its
# `worker` label is the replica's URL as ROUTER_WORKERS gives it (normalised).
ROUTER = '{instance=~"$router"}'
# The router's key gate (its ROUTER_PORT, scraped as `router_gate`): another target than the
# router's metrics port, so another variable.
GATE = '{instance=~"$gate"}'
REPLICA = "{{instance}} {{worker}}"
ROUTER_ROW = "Router: replicas behind vLLM's router (router profile)"


def _router_rate(metric: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{ROUTER}[{RATE}]))"


def _zero_until_first(counter: str) -> Query:
    """A counter that appears with its first event (an error, a retry): 0 per router while the
    router answered requests and none happened, so that no line means no requests at all."""
    served = _router_rate("vllm_router_requests_total", "instance")
    label = counter.removeprefix("vllm_router_").removesuffix("_total").replace("_", " ")
    return Query(
        f"{_router_rate(counter, 'instance')} or 0 * {served}", f"{{{{instance}}}}: {label}"
    )


ROUTER_PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(
        "Router: replicas in rotation",
        "Per router and replica: healthy 1 while its health checks pass (0 after "
        "ROUTER_HEALTH_FAILURES failures in a row), circuit open 1 while the router's circuit "
        "breaker keeps requests off it (after consecutive failed requests; the circuit shows "
        "only once a request went to the replica). A replica at healthy 0 or circuit open 1 "
        "gets no request: RouterReplicaOutOfRotation fires after 30 s. A drained replica, or "
        "one the fleet watch holds out (next panel), keeps its last value (vllm-router does "
        "not drop the series).",
        "short",
        (
            Query(
                f"max by (instance, worker) (vllm_router_worker_health{ROUTER})",
                f"{REPLICA}: healthy",
            ),
            Query(
                f"max by (instance, worker) (vllm_router_cb_state{ROUTER}) == bool 1",
                f"{REPLICA}: circuit open",
            ),
        ),
        maximum=1.0,
    ),
    PanelSpec(
        "Router: replicas refused by the fleet watch",
        "Per router gate and replica: 1 while the gate's fleet watch holds the replica out of "
        "rotation because its model or settings differ from most replicas' or it cannot be "
        "compared (401: not the router's key), 0 while it serves what the fleet serves. "
        "Checked every ROUTER_FLEET_CHECK_S. The panel above still shows such a replica healthy "
        "(vllm-router keeps its last health): RouterReplicaRefused fires after 1 minute. The "
        "gate's /health names the fields that differ; `sparkserve doctor --fleet` too.",
        "short",
        (
            Query(
                f"max by (instance, worker) (sparkserve_router_replica_refused{GATE})",
                f"{REPLICA}: refused",
            ),
        ),
        maximum=1.0,
    ),
    PanelSpec(
        "Router: requests per replica",
        "Requests per second the router sent to each replica (every policy counts them). Under "
        "cache_aware a busy conversation stays on one replica, so an uneven split is normal; a "
        "replica at 0 while others serve is out of rotation or drained.",
        "reqps",
        (
            Query(
                _router_rate("vllm_router_processed_requests_total", "instance, worker"),
                f"{REPLICA}: sent",
            ),
        ),
    ),
    PanelSpec(
        "Router: requests in flight per replica",
        "Requests the router has open on each replica (until the response body ends): the load "
        "cache_aware and power_of_two balance on. One replica far above the others with the "
        "rest idle means the balance thresholds let one conversation's replica saturate.",
        "short",
        (
            Query(
                f"sum by (instance, worker) (vllm_router_running_requests{ROUTER})",
                f"{REPLICA}: in flight",
            ),
        ),
    ),
    PanelSpec(
        "Router: answered, errors and retries",
        "Per router, per second: requests answered (2xx), requests that ended in an error (no "
        "replica available, a replica's 5xx after the last retry, ...) and retries (a "
        "connection refused or a 5xx re-sent, the replica chosen again). Healthy: errors 0; "
        "retries only around a replica that left rotation.",
        "reqps",
        (
            Query(_router_rate("vllm_router_requests_total", "instance"), "{{instance}}: answered"),
            _zero_until_first("vllm_router_request_errors_total"),
            _zero_until_first("vllm_router_retries_total"),
        ),
    ),
    PanelSpec(
        "Router: cache_aware decisions",
        "Per router, per second, how cache_aware chose (empty under another policy): prefix_hit "
        "(the replica whose cache holds the prompt's start), prefix_miss (no replica held "
        "enough of it: the least loaded), load_imbalance (the load overrode the cache) and "
        "missing_tokens (a replica gave no token ids: load only; a replica without "
        "--enable-scale-out answers them 403, docs/CLUSTER.md). Healthy multi-turn traffic is "
        "mostly prefix_hit; missing_tokens is a setting to fix.",
        "reqps",
        (
            Query(
                _router_rate("vllm_router_prefix_routing_decisions_total", "instance, outcome"),
                "{{instance}}: {{outcome}}",
            ),
        ),
    ),
)


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model, built with the foundation SDK."""
    from grafana_foundation_sdk.builders import common as common_builders
    from grafana_foundation_sdk.builders import dashboard as dash
    from grafana_foundation_sdk.builders import prometheus, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement
    from grafana_foundation_sdk.models.dashboard import (
        DashboardCursorSync,
        DataSourceRef,
        VariableOption,
        VariableRefresh,
        VariableSort,
    )

    source = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
    board = (
        dash.Dashboard("sparkserve")
        .uid(DASHBOARD_UID)
        .description("vLLM, the drafter, the prefix cache and the host's memory (docs/METRICS.md)")
        .tags(["sparkserve", "vllm", "dgx-spark"])
        .refresh("10s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
    )
    for variable in VARIABLES:
        board = board.with_variable(
            dash.QueryVariable(variable.name)
            .label(variable.label)
            .query(variable.query)
            .datasource(source)
            .multi(True)
            .include_all(True)
            .current(VariableOption(selected=True, text="All", value="$__all"))
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
        )
    for spec in (*PANELS, *ROUTER_PANELS):
        if spec is ROUTER_PANELS[0]:
            board = board.with_row(dash.Row(ROUTER_ROW))
        panel = (
            timeseries.Panel()
            .title(spec.title)
            .description(spec.healthy)
            .datasource(source)
            .unit(spec.unit)
            .height(8)
            .span(12)
            .legend(
                common_builders.VizLegendOptions()
                .display_mode(LegendDisplayMode.LIST)
                .placement(LegendPlacement.BOTTOM)
                .show_legend(True)
            )
        )
        if spec.minimum is not None:
            panel = panel.min(spec.minimum)
        if spec.maximum is not None:
            panel = panel.max(spec.maximum)
        for ref, query in zip("ABCDEFGH", spec.queries, strict=False):
            panel = panel.with_target(
                prometheus.Dataquery()
                .expr(query.expr)
                .legend_format(query.legend)
                .ref_id(ref)
                .datasource(source)
            )
        board = board.with_panel(panel)
    encoded: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return encoded


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def sync(repo: Path, check: bool) -> bool:
    """Write (or with check, only compare) the provisioned file; True when it drifted."""
    path = repo / OUTPUT
    fresh = render()
    old = path.read_text() if path.exists() else ""
    if fresh != old and not check:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fresh)
    return fresh != old


def _run(args: argparse.Namespace) -> int:
    try:
        drifted = sync(args.repo, args.check)
    except ImportError as error:
        print(
            f"sparkserve dashboard: {error.name or 'grafana_foundation_sdk'} is not installed; "
            "pip install the grafana-foundation-sdk pinned in requirements/test-core.lock",
            file=sys.stderr,
        )
        return 2
    if drifted:
        print(f"{'out of date' if args.check else 'updated'}: {OUTPUT}")
    return 1 if drifted and args.check else 0


def add_command(commands: Any) -> None:
    parser = commands.add_parser(
        "dashboard", help="regenerate the metrics profile's Grafana dashboard from its source"
    )
    parser.add_argument("--check", action="store_true", help="only report drift (exit 1)")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to update")
    parser.set_defaults(run=_run)
