"""The metrics profile, checked with the real things: the dashboard against its source (the
foundation SDK), promtool on the config and the alert rules, Docker Compose on the profile,
and Debian's Prometheus and node-exporter scraping a real vLLM CPU server (DFlash drafter,
prefix caching, the memory guard) so that every dashboard panel's query returns data; and the
real vllm-router (`sparkserve router`) in front of that server and of a replica that is down:
its panels have data, RouterReplicaOutOfRotation fires for the down one, and a drain leaves
its health at 0; and its gate with API_KEY set, scraped with the key from a file, in front of
a replica its fleet watch refuses: RouterReplicaRefused fires for that one, and
RouterReplicaOutOfRotation does not."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sparkserve.client.metrics import parse as parse_metrics
from sparkserve.launch.versions import read_versions
from sparkserve.monitoring.dashboard import OUTPUT, PANELS, RATE, ROUTER_PANELS, PanelSpec, sync
from support import api_calls
from support.compose_config import compose_config
from support.prometheus import (
    ALERTS,
    METRIC_NAME,
    PROMETHEUS_CONFIG,
    Prometheus,
    PrometheusError,
    binary,
    node_exporter,
)
from support.router_process import RouterProcess
from support.vllm_server import LOOPBACK, VllmServer, free_port, metric_sum

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / OUTPUT
RULE_TESTS = REPO / "tests" / "monitoring" / "alerts_test.yml"
METRICS_SERVICES = {"prometheus", "node-exporter", "grafana"}
GATE_KEY = "sk-gate-metrics-Hq4vN8"
HOST_PATHS = {"node-exporter": ("/proc", "/sys")}  # the only host folders a service mounts


def dashboard_queries(
    panels: tuple[PanelSpec, ...] = (*PANELS, *ROUTER_PANELS),
) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of the provisioned dashboard's `panels`."""
    board = json.loads(DASHBOARD.read_text())
    titles = {p.title for p in panels}
    return [(p["title"], t["expr"]) for p in board["panels"] if p["title"] in titles
            for t in p.get("targets", [])]  # fmt: skip


def idle_markers() -> set[str]:
    """The "no traffic" queries: a value only while the server is idle."""
    return {q.expr for p in PANELS for q in p.queries if q.idle}


def every_server(expr: str, window: str) -> str:
    """A query as Grafana sends it with every variable on All and `window` as rate window."""
    for variable in ("$instance", "$model", "$host", "$router", "$gate"):
        expr = expr.replace(variable, ".+")
    return expr.replace(RATE, window)


def test_dashboard_matches_its_source() -> None:
    assert not sync(REPO, check=True), "run: PYTHONPATH=src python -m sparkserve dashboard"
    assert [title for title, _ in dashboard_queries()][:1] == [PANELS[0].title]
    everything = (*PANELS, *ROUTER_PANELS)
    board = json.loads(DASHBOARD.read_text())
    assert len(dashboard_queries()) == sum(len(p.queries) for p in everything)
    assert [p["title"] for p in board["panels"] if p["type"] != "row"] == [
        p.title for p in everything
    ]


def test_metric_names_come_from_the_shipped_vllm() -> None:
    """Every vllm: metric a panel or an alert reads is declared by the vLLM the image ships."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    package = Path(spec.origin).parent
    shipped = read_versions(REPO / "versions.env")["VLLM_VERSION"]
    assert f"vllm-{shipped}.dist-info" in {p.name for p in package.parent.iterdir()}
    declared = set()
    for source in (package / "v1").rglob("*.py"):
        declared |= set(re.findall(r'"(vllm:[a-z_]+)"', source.read_text(errors="replace")))
    texts = [expr for _, expr in dashboard_queries()] + [ALERTS.read_text()]
    used = {m for text in texts for m in METRIC_NAME.findall(text) if m.startswith("vllm:")}
    bare = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in used}
    assert used and not bare - declared, f"not in vLLM {shipped}: {sorted(bare - declared)}"


def test_promtool_checks_the_config_and_the_rules() -> None:
    promtool = binary("promtool")
    for argv in (
        ["check", "config", str(PROMETHEUS_CONFIG)],
        ["check", "rules", str(ALERTS)],
        ["test", "rules", str(RULE_TESTS)],
    ):
        done = subprocess.run([promtool, *argv], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"promtool {' '.join(argv)}:\n{done.stdout}{done.stderr}"
        assert "SUCCESS" in done.stdout + done.stderr


def test_every_alert_has_a_rule_test_and_a_runbook() -> None:
    alerts = set(re.findall(r"- alert: (\w+)", ALERTS.read_text()))
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert alerts and alerts == tested
    docs = (REPO / "docs" / "METRICS.md").read_text()
    for alert in alerts:
        assert f"### {alert}" in docs, alert


def test_compose_metrics_profile_is_pinned_local_and_off_by_default(tmp_path: Path) -> None:
    (tmp_path / "docker-compose.yml").write_text((REPO / "docker-compose.yml").read_text())
    assert not METRICS_SERVICES & set(compose_config(tmp_path)["services"])
    services = compose_config(tmp_path, None, "--profile", "metrics")["services"]
    assert set(services) >= METRICS_SERVICES
    for name in METRICS_SERVICES:
        service = services[name]
        reference, _, digest = service["image"].partition("@")
        image, _, tag = reference.rpartition(":")
        assert image in ("prom/prometheus", "prom/node-exporter", "grafana/grafana"), image
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: pin a release, not {tag!r}"
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{name}: and its digest"
        assert service["network_mode"] == "host" and "ports" not in service
        listen = " ".join(service.get("command") or []) + json.dumps(service.get("environment"))
        assert "127.0.0.1" in listen and "0.0.0.0" not in listen, name
        assert service["cap_drop"] == ["ALL"] and "cap_add" not in service, name
        assert service["security_opt"] == ["no-new-privileges:true"], name
        assert int(service["mem_limit"]) > 0 and float(service["cpus"]) > 0, name
        for volume in service["volumes"]:
            source = volume["source"]
            if volume["type"] != "bind":
                continue
            assert volume["read_only"], f"{name}: mount {source} read-only"
            if source not in HOST_PATHS.get(name, ()):
                repo_path = Path(source).relative_to(tmp_path)
                assert (REPO / repo_path).exists(), f"{name} mounts a missing {repo_path}"
    # node-exporter reads the host's /proc and /sys, never its root (the Docker socket)
    binds = {v["source"] for v in services["node-exporter"]["volumes"] if v["type"] == "bind"}
    assert binds == set(HOST_PATHS["node-exporter"])
    assert "pid" not in services["node-exporter"]
    grafana = services["grafana"]["environment"]
    assert grafana["GF_AUTH_DISABLE_LOGIN_FORM"] == "true", "no login with the default password"
    assert grafana["GF_AUTH_BASIC_ENABLED"] == "false", "nor through the API"


# ---------------------------------------------------------------- Prometheus for real


def test_a_wrong_target_and_a_missing_metric_are_named(tmp_path: Path) -> None:
    """Nothing listens at the vllm target: the wait names it and why; a query over a metric
    that does not exist is reported by name, not as an empty panel."""
    nothing = f"{LOOPBACK}:{free_port()}"
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    exporter, node_port = node_exporter(tmp_path, textfiles)
    prometheus = Prometheus(tmp_path, {"vllm": nothing, "node": f"{LOOPBACK}:{node_port}"})
    with exporter, prometheus.run():
        # Once both targets were scraped (a guard against a hang, not a speed target), the
        # wait reports what it sees at once.
        deadline = time.monotonic() + 60
        while True:
            health = {t["labels"]["job"]: t["health"] for t in prometheus.api("targets")[
                "activeTargets"
            ]}  # fmt: skip
            if (health.get("vllm"), health.get("node")) == ("down", "up"):
                break
            assert time.monotonic() < deadline, health
            time.sleep(0.2)
        with pytest.raises(PrometheusError) as info:
            prometheus.wait_targets_up(timeout_s=0)
        message = str(info.value)
        assert f"job vllm at http://{nothing}/metrics is down" in message
        assert "connection refused" in message and "job node" not in message
        assert prometheus.missing_metrics("rate(vllm:no_such_metric_total[1m])") == [
            "vllm:no_such_metric_total"
        ]
        assert prometheus.missing_metrics("node_memory_MemAvailable_bytes") == []


@pytest.mark.e2e
def test_every_panel_has_data_after_a_bench(shared_server: VllmServer, tmp_path: Path) -> None:
    assert shared_server.env is not None
    textfiles = Path(shared_server.env["HF_HOME"]) / "sparkserve" / "metrics"
    exporter, node_port = node_exporter(tmp_path, textfiles)
    targets = {"vllm": f"{LOOPBACK}:{shared_server.port}", "node": f"{LOOPBACK}:{node_port}"}
    prometheus = Prometheus(tmp_path, targets)
    with exporter, prometheus.run():
        prometheus.wait_targets_up()
        guard = prometheus.values("sparkserve_guard_watching")
        assert guard == [1.0], f"the launcher's guard writes no state into {textfiles}"
        bench = subprocess.run(
            [sys.executable, "-m", "sparkserve", "bench", "--url", shared_server.base_url,
             "--out", str(tmp_path / "bench"), "--concurrency", "1", "--kinds", "prose",
             "--gen-tokens", "24", "--prefix-tokens", "1200", "--ttft-rounds", "1"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert bench.returncode == 0, bench.stderr
        # Two scrapes of every target after the last request (a guard against a hang, 60 s).
        after = time.time() + 2.0
        deadline = time.monotonic() + 60
        while min(prometheus.values("timestamp(up)") or [0.0]) <= after:
            assert time.monotonic() < deadline, "Prometheus stopped scraping"
            time.sleep(0.2)
        window = f"{int(time.monotonic() - prometheus.started) + 5}s"  # covers the whole bench
        empty = []
        for title, expr in dashboard_queries(PANELS):
            query = every_server(expr, window)
            if expr in idle_markers():  # the bench was traffic: no "no traffic" line
                if prometheus.values(query):
                    empty.append(f"{title!r}: {query} says no traffic after a bench")
                continue
            if not prometheus.values(query):
                missing = prometheus.missing_metrics(query)
                why = f"no series of {', '.join(missing)}" if missing else "no finite value"
                empty.append(f"{title!r}: {query} -> {why}")
        unhealthy = [f"{r['name']}: {r.get('lastError')}" for r in prometheus.rules()
                     if r["health"] != "ok"]  # fmt: skip
    assert not empty, "panels without data:\n" + "\n".join(empty)
    assert not unhealthy, "rules that do not evaluate:\n" + "\n".join(unhealthy)


def chat(number: int) -> bytes:
    question = f"Question {number}: what does a router do with a replica that is down?"
    return json.dumps(api_calls.chat(question, max_tokens=4)).encode()


@pytest.mark.e2e
def test_the_router_is_scraped_and_a_replica_out_of_rotation_fires(
    shared_server: VllmServer, sparkserve_site: Path, tmp_path: Path
) -> None:
    """The real vllm-router (`sparkserve router`, its gate) in front of the shared server and
    of a replica that never answers: Prometheus (the shipped config and rules) scrapes the
    router, every router panel's query has data after a few requests, and
    RouterReplicaOutOfRotation fires for the down replica, for it alone."""
    down = f"http://{LOOPBACK}:{free_port()}"
    router = RouterProcess(
        tmp_path, sparkserve_site, [shared_server.base_url, down], ROUTER_HEALTH_INTERVAL_S="1"
    )
    prometheus = Prometheus(
        tmp_path,
        {"vllm": f"{LOOPBACK}:{shared_server.port}", "router": router.metrics_target,
         "router_gate": f"{LOOPBACK}:{router.port}"},
    )  # fmt: skip
    with router.running(), prometheus.run():
        prometheus.wait_targets_up()
        for number in range(4):
            request = urllib.request.Request(
                router.url + "/v1/chat/completions", data=chat(number),
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=120) as reply:
                assert reply.status == 200
        # Two scrapes after the last request, and the alert's 30 s (guards against a hang).
        after = time.time() + 2.0
        deadline = time.monotonic() + 120
        while (
            not prometheus.firing("RouterReplicaOutOfRotation")
            or min(prometheus.values("timestamp(up)") or [0.0]) <= after
        ):
            assert time.monotonic() < deadline, (
                f"no RouterReplicaOutOfRotation for {down}: {prometheus.api('alerts')}\n"
                f"{router.log.read_text(errors='replace')[-3000:]}"
            )
            time.sleep(0.5)
        firing = prometheus.firing("RouterReplicaOutOfRotation")
        assert [(a["worker"], a["instance"]) for a in firing] == [(down, router.metrics_target)]
        assert prometheus.values(
            f'vllm_router_worker_health{{worker="{shared_server.base_url}"}}'
        ) == [1.0]
        window = f"{int(time.monotonic() - prometheus.started) + 5}s"
        empty = []
        for title, expr in dashboard_queries(ROUTER_PANELS):
            query = every_server(expr, window)
            if not prometheus.values(query):
                missing = prometheus.missing_metrics(query)
                why = f"no series of {', '.join(missing)}" if missing else "no finite value"
                empty.append(f"{title!r}: {query} -> {why}")
        unhealthy = [f"{r['name']}: {r.get('lastError')}" for r in prometheus.rules()
                     if r["health"] != "ok"]  # fmt: skip
        # Drained, the down replica leaves rotation but keeps its last health (0): vllm-router
        # drops no series, so the alert goes on firing (docs/METRICS.md says so).
        drained = router.admin("drain", down)
        assert drained.returncode == 0, drained.stderr
        assert [w["url"] for w in json.loads(router.admin("workers").stdout)] == [
            shared_server.base_url
        ]
        with urllib.request.urlopen(f"http://{router.metrics_target}/metrics", timeout=30) as got:
            health = parse_metrics(got.read().decode())
        assert metric_sum(health, "vllm_router_worker_health", worker=down) == 0.0
        assert any(name == "vllm_router_worker_health" and ("worker", down) in labels
                   for name, labels in health), "the drained replica's series is gone"  # fmt: skip
    assert not empty, "router panels without data:\n" + "\n".join(empty)
    assert not unhealthy, "rules that do not evaluate:\n" + "\n".join(unhealthy)


@pytest.mark.e2e
def test_a_replica_the_fleet_watch_refuses_fires_behind_the_key(
    shared_server: VllmServer, sparkserve_site: Path, tmp_path: Path
) -> None:
    """The gate with API_KEY set, scraped by Prometheus with the key read from a file (the
    router_gate job's `authorization: credentials_file`, as docs/METRICS.md says). Its second
    replica answers /health but cannot be compared: it is another router's gate, where
    /version is no route (404). The fleet watch holds it out: the refused panel's query reads 1
    for it and 0 for the shared server, RouterReplicaRefused fires for it alone, and
    RouterReplicaOutOfRotation does not fire (vllm-router still has it healthy)."""
    key_file = tmp_path / "api-key"
    key_file.write_text(GATE_KEY + "\n")  # as `echo KEY > file` writes it
    key_file.chmod(0o600)
    other = RouterProcess(tmp_path, sparkserve_site, [shared_server.base_url])
    with other.running():
        odd = other.url
        router = RouterProcess(
            tmp_path, sparkserve_site, [shared_server.base_url, odd],
            API_KEY=GATE_KEY, ROUTER_FLEET_CHECK_S="5", ROUTER_HEALTH_INTERVAL_S="1",
        )  # fmt: skip
        gate = f"{LOOPBACK}:{router.port}"
        prometheus = Prometheus(
            tmp_path, {"router": router.metrics_target, "router_gate": gate},
            keys={"router_gate": key_file},
        )  # fmt: skip
        with router.running(), prometheus.run():
            status, body = api_calls.call(router.url + "/health", None)
            assert status == 200, body
            refused = json.loads(body)["refused"]
            assert [r["worker"] for r in refused] == [odd], refused
            assert "HTTP 404 on /version" in refused[0]["why"], refused
            assert api_calls.call(router.url + "/metrics", None)[0] == 401, "the key is needed"
            prometheus.wait_targets_up()  # the gate answers Prometheus: it sent the key
            # The rule's 1 minute and a few evaluations (a guard against a hang).
            deadline = time.monotonic() + 150
            while not prometheus.firing("RouterReplicaRefused"):
                assert time.monotonic() < deadline, (
                    f"no RouterReplicaRefused for {odd}: {prometheus.api('alerts')}\n"
                    f"{router.tail()}"
                )
                time.sleep(0.5)
            firing = prometheus.firing("RouterReplicaRefused")
            assert [(a["worker"], a["instance"]) for a in firing] == [(odd, gate)]
            (panel,) = [e for t, e in dashboard_queries(ROUTER_PANELS) if "refused" in e]
            shown = {
                r["metric"]["worker"]: float(r["value"][1])
                for r in prometheus.api("query", query=every_server(panel, "1m"))["result"]
            }
            assert shown == {shared_server.base_url: 0.0, odd: 1.0}, shown
            # Held out a minute and more: vllm-router has not seen it unhealthy or its circuit
            # open, so the other alert is quiet (docs/METRICS.md says so).
            assert not prometheus.firing("RouterReplicaOutOfRotation"), prometheus.api("alerts")
            assert not prometheus.values(f'vllm_router_worker_health{{worker="{odd}"}} == 0')
            assert not prometheus.values(f'vllm_router_cb_state{{worker="{odd}"}} == 1')
            assert [w["url"] for w in json.loads(router.admin("workers").stdout)] == [
                shared_server.base_url
            ]
