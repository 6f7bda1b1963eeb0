"""The dashboard's own queries, evaluated by promtool (`promtool test rules`) against series of
two vLLM servers serving the same model name (one busy, one idle), one server that is down,
and two hosts: the servers and hosts are never summed together, an idle server shows as idle
(0 on the panel's "no traffic" line) and a down one as a gap, per-position acceptance divides
by the drafts that reached each position, swap growth is in bytes per second, and a guard
file a dead guard left shows as not watching."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from sparkserve.monitoring.dashboard import PANELS, RATE, PanelSpec, Query
from support.prometheus import binary

GIB = 1 << 30
BUSY, IDLE, DOWN = "busy:8000", "idle:8000", "down:8000"
FRESH, STALE = "fresh:9100", "stale:9100"
MODEL = "qwen"


def _server(instance: str, metric: str, values: str, **labels: str) -> dict[str, str]:
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    series = f'{metric}{{instance="{instance}",job="vllm",model_name="{MODEL}",engine="0"{extra}}}'
    return {"series": series, "values": values}


def _host(instance: str, metric: str, values: str) -> dict[str, str]:
    return {"series": f'{metric}{{instance="{instance}",job="node"}}', "values": values}


def _histogram(instance: str, name: str, per_minute: int) -> list[dict[str, str]]:
    grows = f"0+{per_minute}x10"
    return [
        *(_server(instance, f"{name}_bucket", grows, le=le) for le in ("0.5", "1", "+Inf")),
        _server(instance, f"{name}_count", grows),
    ]


def input_series() -> list[dict[str, str]]:
    """Eleven one-minute samples. Busy: 10 tokens/s, prefix hits half the tokens looked up,
    100 drafts a minute of which 50 had tokens at positions 1 and 2 (the drafter proposed one
    token in the others). Idle: every counter flat. Down: only `up 0`."""
    series = [{"series": f'up{{instance="{DOWN}",job="vllm"}}', "values": "0x10"}]
    busy = {
        "vllm:generation_tokens_total": "0+600x10",
        "vllm:prefix_cache_queries_total": "0+1000x10",
        "vllm:prefix_cache_hits_total": "0+500x10",
        "vllm:spec_decode_num_drafts_total": "0+100x10",
        "vllm:spec_decode_num_accepted_tokens_total": "0+130x10",
        "vllm:num_requests_running": "2x10",
        "vllm:num_requests_waiting": "1x10",
        "vllm:kv_cache_usage_perc": "0.5x10",
    }
    for instance in (BUSY, IDLE):
        series.append({"series": f'up{{instance="{instance}",job="vllm"}}', "values": "1x10"})
        for metric, values in busy.items():
            series.append(_server(instance, metric, values if instance == BUSY else "0x10"))
        for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"):
            series += _histogram(instance, name, 60 if instance == BUSY else 0)
        for position, accepted, reached in ((0, 80, 100), (1, 40, 50), (2, 10, 50)):
            busy_now = instance == BUSY
            series += [
                _server(instance, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                        f"0+{accepted}x10" if busy_now else "7x10", position=str(position)),
                _server(instance, "sparkserve_spec_decode_num_drafts_per_pos_total",
                        f"0+{reached}x10" if busy_now else "9x10", position=str(position)),
            ]  # fmt: skip
    for instance, available, stamps in ((FRESH, 20, "0+60x10"), (STALE, 10, "0+60x3 180x7")):
        series += [
            _host(instance, "node_memory_MemAvailable_bytes", f"{available * GIB}x10"),
            _host(instance, "node_memory_SwapTotal_bytes", f"{8 * GIB}x10"),
            # the fresh host swaps out 60 MiB a minute: 1 MiB/s
            _host(instance, "node_memory_SwapFree_bytes",
                  f"{8 * GIB}-62914560x10" if instance == FRESH else f"{8 * GIB}x10"),
            _host(instance, "sparkserve_guard_updated_timestamp_seconds", stamps),
            _host(instance, "sparkserve_guard_watching", "1x10"),
            _host(instance, "sparkserve_guard_os_reserve_bytes", f"{14 * GIB}x10"),
        ]  # fmt: skip
    return series


def expr(query: Query, instance: str = ".+", host: str = ".+") -> str:
    """The query as Grafana sends it with the variables set and a 5-minute rate window."""
    text = query.expr.replace(RATE, "5m").replace("$instance", instance)
    return text.replace("$model", ".+").replace("$host", host)


def panel(title: str) -> PanelSpec:
    (found,) = [p for p in PANELS if p.title == title]
    return found


def query(title: str, legend_end: str) -> Query:
    (found,) = [q for q in panel(title).queries if q.legend.endswith(legend_end)]
    return found


def server_labels(instance: str, **extra: str) -> str:
    inner = f'instance="{instance}",model_name="{MODEL}"' + "".join(
        f',{k}="{v}"' for k, v in extra.items()
    )
    return "{" + inner + "}"


def host_labels(instance: str, metric: str = "") -> str:
    return f'{metric}{{instance="{instance}",job="node"}}'


def samples(*pairs: tuple[str, float]) -> list[dict[str, Any]]:
    return [{"labels": labels, "value": value} for labels, value in pairs]


def vllm_queries() -> list[tuple[PanelSpec, Query]]:
    return [(p, q) for p in PANELS for q in p.queries if "$instance" in q.expr]


def expectations() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []

    def case(text: str, expected: list[dict[str, Any]]) -> None:
        cases.append({"expr": text, "eval_time": "10m", "exp_samples": expected})

    for spec, item in vllm_queries():
        # A server that is down has no series: every vLLM query is a gap.
        case(expr(item, DOWN), [])
        # An idle one: rates and gauges 0, ratios and percentiles no value, the marker 0.
        has_marker = any(q.idle for q in spec.queries)
        idle_zero = item.idle or not has_marker
        case(expr(item, IDLE), samples((server_labels(IDLE), 0.0)) if idle_zero else [])
        if item.idle:  # the busy server has traffic: no marker
            case(expr(item, BUSY), [])
    # Two servers serving the same model name stay two lines, neither summed nor maxed.
    tokens = query("Decode tokens/s", "generated")
    case(expr(tokens), samples((server_labels(BUSY), 10.0), (server_labels(IDLE), 0.0)))
    kv = query("KV cache usage", "KV pool used")
    case(expr(kv), samples((server_labels(BUSY), 0.5), (server_labels(IDLE), 0.0)))
    case(expr(query("Prefix-cache hit rate", "hit rate"), BUSY),
         samples((server_labels(BUSY), 0.5)))  # fmt: skip
    case(expr(query("Mean acceptance length", "mean"), BUSY),
         samples((server_labels(BUSY), 2.3)))  # fmt: skip
    # Position 1: 40 accepted of the 50 drafts that had a token there (not of all 100).
    per_position = query("Acceptance per draft position", "}}")
    case(expr(per_position, BUSY), samples(
        *((server_labels(BUSY, position=str(p)), share) for p, share in enumerate((0.8, 0.8, 0.2)))
    ))  # fmt: skip
    # Hosts: one line each; swap growth in bytes per second; a stale guard file is not watching.
    available = query("Host MemAvailable, OS reserve and guard floor", "MemAvailable")
    case(expr(available), samples(
        (host_labels(FRESH, "node_memory_MemAvailable_bytes"), 20.0 * GIB),
        (host_labels(STALE, "node_memory_MemAvailable_bytes"), 10.0 * GIB),
    ))  # fmt: skip
    assert panel("Swap growth").unit == "Bps"
    growth = query("Swap growth", "swap growth")
    case(expr(growth), samples((host_labels(FRESH), 1048576.0), (host_labels(STALE), 0.0)))
    watching = query("Memory guard", "watching")
    case(expr(watching), samples((host_labels(FRESH), 1.0), (host_labels(STALE), 0.0)))
    return cases


def test_dashboard_queries_on_busy_idle_and_down_servers(tmp_path: Path) -> None:
    assert len(vllm_queries()) > 10, "the vLLM panels select by $instance"
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "dashboard queries",
                "interval": "1m",
                "input_series": input_series(),
                "promql_expr_test": expectations(),
            }
        ],
    }
    path = tmp_path / "dashboard_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run(
        [binary("promtool"), "test", "rules", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
