"""Every vLLM metric the project reads (the client, the stress sampler, bench, selftest, the
dashboards and alerts) or names in its docs is one the release under test exports: a renamed
metric would leave a panel empty and a check reading zero, silently. Run on the pinned and the
next release (marker `release`)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("src", "deploy", "docs", "README.md", "docker-compose.yml")
NAME = re.compile(r"vllm:[a-z_]+")
# prometheus_client's series of one metric: a counter's _total, a histogram's parts
SERIES_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def names(text: str) -> list[str]:
    """The metric names in a text; a name ending in "_" is a prefix the code completes."""
    return [name for name in NAME.findall(text) if not name.endswith("_")]


def names_in(paths: list[Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in paths:
        for name in names(path.read_text(errors="replace")):
            found.setdefault(name, path.relative_to(REPO))
    return found


def shipped_files() -> list[Path]:
    files: list[Path] = []
    for entry in SHIPPED:
        path = REPO / entry
        files += [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    return [p for p in files if p.suffix in {".py", ".yml", ".yaml", ".json", ".md", ".sh"}]


def exported_by_vllm() -> set[str]:
    """The metric names the release declares (as string literals in its sources)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    declared: set[str] = set()
    for source in root.rglob("*.py"):
        declared |= set(re.findall(r"[\"'](vllm:[a-z_]+)[\"']", source.read_text(errors="replace")))
    return declared


def is_exported(name: str, declared: set[str]) -> bool:
    if name in declared:
        return True
    return any(name.endswith(s) and name[: -len(s)] in declared for s in SERIES_SUFFIXES)


@pytest.mark.release
def test_every_vllm_metric_the_project_reads_is_exported_by_the_release() -> None:
    used = names_in(shipped_files())
    assert "vllm:prefix_cache_hits_total" in used and len(used) >= 10, used
    declared = exported_by_vllm()
    missing = {name: str(path) for name, path in used.items() if not is_exported(name, declared)}
    assert not missing, f"not exported by this vLLM: {missing}"


def test_a_renamed_metric_is_caught() -> None:
    """The check itself: a name vLLM does not declare is reported, a counter's series is not."""
    declared = {"vllm:prefix_cache_hits", "vllm:iteration_tokens_total"}
    assert is_exported("vllm:prefix_cache_hits_total", declared)
    assert is_exported("vllm:iteration_tokens_total", declared)
    assert not is_exported("vllm:prefix_cache_hit_total", declared)
    text = "`vllm:gpu_prefix_cache_hits_total` and f'vllm:spec_decode_num_accepted_tokens_'"
    assert names(text) == ["vllm:gpu_prefix_cache_hits_total"]


def test_every_router_gate_metric_read_is_one_the_gate_exports() -> None:
    """The dashboard and the alerts read sparkserve_router_* only as the gate's /metrics
    writes it (sparkserve.router.watch.metrics_text, with a replica refused and one not)."""
    from sparkserve.client.metrics import parse
    from sparkserve.router.watch import FleetState, Refusal, metrics_text

    state = FleetState(True, ("http://a:8000", "http://b:8000"), (Refusal("http://b:8000", "x"),))
    exported = {name for name, _ in parse(metrics_text(state))}
    read = REPO / "deploy" / "metrics"
    texts = [p.read_text() for p in (*read.rglob("*.json"), *read.rglob("*.yml"))]
    used = {name for text in texts for name in re.findall(r"sparkserve_router_[a-z_]+", text)}
    assert used == {"sparkserve_router_replica_refused"}, used
    assert used <= exported, f"not exported by the gate: {sorted(used - exported)}"
