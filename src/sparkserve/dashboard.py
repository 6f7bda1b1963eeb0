"""The Grafana dashboard of the metrics profile, written as code: one source, one JSON file.

PANELS says what each panel shows (PromQL over vLLM's, node-exporter's and the guard's
metrics) and what a healthy value looks like; `build()` turns it into a dashboard with
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

REPO = Path(__file__).resolve().parents[2]
OUTPUT = Path("deploy/metrics/grafana/dashboards/sparkserve.json")
DATASOURCE_UID = "sparkserve-prometheus"  # deploy/metrics/grafana/provisioning/datasources
DASHBOARD_UID = "sparkserve"
RATE = "$__rate_interval"  # Grafana's window: at least four scrape intervals


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    healthy: str  # the panel's description: what it shows and what is healthy on a Spark
    unit: str
    queries: tuple[Query, ...]
    minimum: float | None = 0.0
    maximum: float | None = None


def _rate(metric: str, by: str = "") -> str:
    group = f" by ({by})" if by else ""
    return f"sum{group}(rate({metric}[{RATE}]))"


def _p50_p95(histogram: str) -> tuple[Query, ...]:
    """The median and the 95th percentile of a vLLM histogram over the rate window."""
    return tuple(
        Query(f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket[{RATE}])))", name)
        for q, name in ((0.5, "p50"), (0.95, "p95"))
    )


DRAFTS = _rate("vllm:spec_decode_num_drafts_total")

PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(
        "Decode tokens/s",
        "Generated tokens per second, all requests together. A Spark with the default DFlash "
        "drafter gives ~81 tok/s on agent turns, 54.5 on code, 33 on prose at one stream "
        "(published figures); without a drafter ~28.",
        "short",
        (Query(_rate("vllm:generation_tokens_total"), "generated"),),
    ),
    PanelSpec(
        "Time to first token",
        "p50 and p95 of the time from request to first token. Warm prefixes (cache hits) "
        "should start in a fraction of a second (0.18 s on a 4k prefix on a Spark); a cold "
        "long prompt takes seconds.",
        "s",
        _p50_p95("vllm:time_to_first_token_seconds"),
    ),
    PanelSpec(
        "Inter-token latency",
        "p50 and p95 of the time between streamed tokens. With a drafter tokens arrive in "
        "bursts of accepted drafts, so p50 is small and p95 is one verification step; a p95 "
        "rising under load means the batch is saturated.",
        "s",
        _p50_p95("vllm:inter_token_latency_seconds"),
    ),
    PanelSpec(
        "Requests running and waiting",
        "Requests in the batch and in the queue. Running stays at or under MAX_NUM_SEQS (3); "
        "waiting above 0 for long means more clients than the server runs at once.",
        "short",
        (
            Query("sum(vllm:num_requests_running)", "running"),
            Query("sum(vllm:num_requests_waiting)", "waiting"),
        ),
    ),
    PanelSpec(
        "KV cache usage",
        "Share of the KV pool in use. Near 100 % with requests waiting means the pool, not "
        "the compute, limits concurrency; a full pool preempts requests.",
        "percentunit",
        (Query("max(vllm:kv_cache_usage_perc)", "KV pool used"),),
        maximum=1.0,
    ),
    PanelSpec(
        "Prefix-cache hit rate",
        "Prompt tokens served from cached blocks over tokens looked up. Multi-turn chat and "
        "agents should hit well above half; 0 while prompts arrive is the known failure of "
        "drafters on hybrid models (vLLM #51250) or prompts that diverge inside the cache.",
        "percentunit",
        (
            Query(
                f"{_rate('vllm:prefix_cache_hits_total')} / "
                f"{_rate('vllm:prefix_cache_queries_total')}",
                "hit rate",
            ),
        ),
        maximum=1.0,
    ),
    PanelSpec(
        "Mean acceptance length",
        "Tokens per verification step: 1 + accepted draft tokens / drafts. DFlash on a Spark: "
        "~7.7 on code, 8.3-8.7 on agent turns, ~2.3 on prose; 1.0 means the drafter earns "
        "nothing.",
        "short",
        (Query(f"1 + {_rate('vllm:spec_decode_num_accepted_tokens_total')} / {DRAFTS}", "mean"),),
    ),
    PanelSpec(
        "Acceptance per draft position",
        "Share of drafts whose token at this position was accepted. It falls with the "
        "position; a curve that drops to 0 after position k says NUM_SPEC_TOKENS above k "
        "only costs compute.",
        "percentunit",
        (
            Query(
                f"{_rate('vllm:spec_decode_num_accepted_tokens_per_pos_total', 'position')} "
                f"/ scalar({DRAFTS})",
                "position {{position}}",
            ),
        ),
        maximum=1.0,
    ),
    PanelSpec(
        "Host MemAvailable, OS reserve and guard floor",
        "MemAvailable must stay above OS_RESERVE_GB (14 GiB; ~15 GiB is left under peak "
        "3-stream load at GPU_MEM 0.82 on a Spark). At the guard's floor (half the reserve) "
        "the guard stops vLLM.",
        "bytes",
        (
            Query("node_memory_MemAvailable_bytes", "MemAvailable"),
            Query("max(sparkserve_guard_os_reserve_bytes)", "OS reserve"),
            Query("max(sparkserve_guard_floor_bytes)", "guard floor"),
        ),
    ),
    PanelSpec(
        "Swap",
        "Swap in use and how fast it grows (bytes per second). Healthy is flat: any "
        "sustained growth under load is the first sign of a squeeze (0.88 and above swapped on a "
        "Spark).",
        "bytes",
        (
            Query("node_memory_SwapTotal_bytes - node_memory_SwapFree_bytes", "swap used"),
            Query(f"-deriv(node_memory_SwapFree_bytes[{RATE}])", "swap growth per second"),
        ),
    ),
    PanelSpec(
        "Memory pressure (PSI)",
        "Share of time tasks stalled on memory: some (at least one task) and full (every "
        "task), from the kernel's pressure-stall information, and the guard's own reading "
        "against its limit (GUARD_PSI_PCT). Healthy is near 0; full above a few percent "
        "means the host is reclaiming hard.",
        "percent",
        (
            Query(f"rate(node_pressure_memory_waiting_seconds_total[{RATE}]) * 100", "some"),
            Query(f"rate(node_pressure_memory_stalled_seconds_total[{RATE}]) * 100", "full"),
            Query("max(sparkserve_guard_psi_full_avg10_percent)", "guard: full avg10"),
            Query("max(sparkserve_guard_psi_limit_percent)", "guard limit"),
        ),
    ),
    PanelSpec(
        "Memory guard",
        "1 while the guard watches vLLM; a trip shows 1 on its reason (mem_available, "
        "swap_out or psi) and stays until the next start. A trip means vLLM was stopped: "
        "read docs/METRICS.md before GUARD_RESUME=1.",
        "short",
        (
            Query("max(sparkserve_guard_watching)", "watching"),
            Query("max by (reason) (sparkserve_guard_tripped)", "tripped: {{reason}}"),
        ),
        maximum=1.0,
    ),
)


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model, built with the foundation SDK."""
    from grafana_foundation_sdk.builders import common as common_builders
    from grafana_foundation_sdk.builders import dashboard as dash
    from grafana_foundation_sdk.builders import prometheus, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement
    from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef

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
    for spec in PANELS:
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
            "pip install the grafana-foundation-sdk pinned in requirements/test-core.txt",
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
