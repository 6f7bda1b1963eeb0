"""Debian's Prometheus and node-exporter, started by a test on loopback, and Prometheus's HTTP
API. scripts/test.sh installs the packages (scripts/lib/system_packages.sh) when missing.

Prometheus runs the repository's own configuration (deploy/metrics/prometheus) with only the
targets, the interval and the rule file's path rewritten for the test. Failures say what is
wrong in one message: which target is down and why, which metric has no series at all.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from support.vllm_server import LOOPBACK, free_port, tail

REPO = Path(__file__).resolve().parents[2]
METRICS_DIR = REPO / "deploy" / "metrics"
PROMETHEUS_CONFIG = METRICS_DIR / "prometheus" / "prometheus.yml"
ALERTS = METRICS_DIR / "prometheus" / "alerts.yml"
METRIC_NAME = re.compile(r"\b((?:vllm|node|sparkserve)[:_][A-Za-z0-9_:]+)")


class PrometheusError(AssertionError):
    """A target is down, a query failed, or a query returned nothing; the message says which."""


def binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise PrometheusError(
            f"{name} not found: run the tests through ./scripts/test.sh, which installs Debian's "
            "prometheus and prometheus-node-exporter packages"
        )
    return found


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return bool(reply.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@contextlib.contextmanager
def process(argv: list[str], log: Path, ready_url: str, timeout_s: float = 120) -> Iterator[None]:
    """Run argv (output to log) until the block ends; wait first until ready_url answers 200."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + timeout_s
            while not _answers(ready_url):
                if proc.poll() is not None:
                    raise PrometheusError(f"{argv[0]} exited with {proc.returncode}:\n{tail(log)}")
                if time.monotonic() > deadline:
                    raise PrometheusError(f"{argv[0]} not ready in {timeout_s:.0f} s:\n{tail(log)}")
                time.sleep(0.2)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


Running = contextlib.AbstractContextManager[None]


def node_exporter(work: Path, textfile_dir: Path) -> tuple[Running, int]:
    port = free_port()
    argv = [
        binary("prometheus-node-exporter"),
        f"--web.listen-address={LOOPBACK}:{port}",
        f"--collector.textfile.directory={textfile_dir}",
    ]
    url = f"http://{LOOPBACK}:{port}/metrics"
    return process(argv, work / "node-exporter.log", url), port


def test_config(
    targets: Mapping[str, str], interval_s: int = 1, keys: Mapping[str, Path] | None = None
) -> dict[str, Any]:
    """The shipped prometheus.yml, its job targets replaced by `targets` (job -> host:port);
    a shipped job a test runs nothing for (the router, in a test of one server) is left out.
    `keys` (job -> a file holding the API key): that job sends it as a Bearer token, read from
    the file (`authorization: credentials_file`), as docs/METRICS.md tells a user to."""
    config: dict[str, Any] = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"]["scrape_interval"] = f"{interval_s}s"
    config["global"]["evaluation_interval"] = f"{interval_s}s"
    config["rule_files"] = [str(PROMETHEUS_CONFIG.parent / name) for name in config["rule_files"]]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    if not set(targets) <= set(jobs):
        raise PrometheusError(f"the shipped config has jobs {sorted(jobs)}, not {sorted(targets)}")
    for name, target in targets.items():
        jobs[name]["static_configs"] = [{"targets": [target]}]
    for name, key_file in (keys or {}).items():
        jobs[name]["authorization"] = {"type": "Bearer", "credentials_file": str(key_file)}
    config["scrape_configs"] = [job for name, job in jobs.items() if name in targets]
    return config


class Prometheus:
    def __init__(
        self, work: Path, targets: Mapping[str, str], keys: Mapping[str, Path] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.work = work
        own = dict(targets, prometheus=f"{LOOPBACK}:{self.port}")
        self.config_path = work / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(test_config(own, keys=keys)))
        self.started = 0.0

    def run(self) -> Running:
        self.started = time.monotonic()
        argv = [
            binary("prometheus"),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.work / 'tsdb'}",
            f"--web.listen-address={LOOPBACK}:{self.port}",
        ]
        return process(argv, self.work / "prometheus.log", self.url + "/-/ready")

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=30) as reply:
                body = json.loads(reply.read())
        except urllib.error.HTTPError as error:
            body = json.loads(error.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def wait_targets_up(self, timeout_s: float = 120) -> None:
        """Every target scraped successfully once; else name the ones that are not, and why."""
        deadline = time.monotonic() + timeout_s
        while True:
            targets = self.api("targets")["activeTargets"]
            down = [t for t in targets if t["health"] != "up"]
            if targets and not down:
                return
            if time.monotonic() > deadline:
                raise PrometheusError(
                    "; ".join(
                        f"scrape target of job {t['labels'].get('job')} at {t['scrapeUrl']} is "
                        f"{t['health']}: {t['lastError'] or 'not scraped yet'}"
                        for t in down
                    )
                    or "Prometheus has no targets"
                )
            time.sleep(0.5)

    def missing_metrics(self, expr: str) -> list[str]:
        """The metric names in expr that Prometheus holds no series of."""
        names = {re.sub(r"_(bucket|sum|count)$", "", n) if n.startswith("vllm:") else n
                 for n in METRIC_NAME.findall(expr)}  # fmt: skip
        missing = []
        for name in sorted(names):
            found = self.api("series", **{"match[]": f'{{__name__=~"{re.escape(name)}.*"}}'})
            if not found:
                missing.append(name)
        return missing

    def values(self, expr: str) -> list[float]:
        """The finite values of an instant query now."""
        data = self.api("query", query=expr)
        return [float(v["value"][1]) for v in data["result"] if math.isfinite(float(v["value"][1]))]

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def firing(self, alert: str) -> list[dict[str, str]]:
        """The labels of each firing instance of `alert` (pending ones are not firing yet)."""
        return [a["labels"] for a in self.api("alerts")["alerts"]
                if a["labels"]["alertname"] == alert and a["state"] == "firing"]  # fmt: skip
