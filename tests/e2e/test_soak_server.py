"""A short soak of the run's shared server (serve.sh, its memory guard beside it): four times
MAX_NUM_SEQS clients for 15 s. Behaviour only (support/soak.py; the figures are
benchmarks/soak.py's): every request ends with all its tokens or a clear HTTP status, none
outlives its timeout, the guard watches throughout and does not trip, the server stays
healthy, and vLLM's and the guard's RSS do not grow beyond a generous bound."""

from __future__ import annotations

import pytest

from sparkserve.client.server import Server
from sparkserve.guard.monitor import marker_path
from sparkserve.launch.settings import tool_settings
from support.cpu_launch import MODEL_NAME
from support.soak import SoakPlan, guard_state, run_soak, summary
from support.vllm_server import VllmServer

pytestmark = pytest.mark.e2e

CLIENTS_PER_SEQ = 4
DURATION_S = 15.0
REQUEST_TIMEOUT_S = 60.0
# Generous: 15 s is too short to show a slow leak (benchmarks/soak.py's long run judges that);
# this catches a leak per request (about 100 requests here) or a runaway.
RSS_GROWTH_BOUND_PCT = 25.0


def test_a_short_soak_ends_every_request_and_leaves_the_server_and_guard_as_they_were(
    shared_server: VllmServer,
) -> None:
    assert shared_server.proc is not None and shared_server.env is not None
    seqs = tool_settings(shared_server.env).values.MAX_NUM_SEQS
    plan = SoakPlan(
        clients=CLIENTS_PER_SEQ * seqs, duration_s=DURATION_S,
        request_timeout_s=REQUEST_TIMEOUT_S, sample_s=0.5,
    )  # fmt: skip
    client = Server(shared_server.base_url, timeout_s=REQUEST_TIMEOUT_S)
    result = run_soak(client, MODEL_NAME, shared_server.proc.pid, plan)
    data = summary(result)

    assert data["requests"] >= plan.clients, data
    unclear = {k: v for k, v in data["outcomes"].items() if k != "ok" and not k.startswith("http ")}
    assert not unclear, f"requests that ended without all tokens or a status: {unclear}"
    assert data["outcomes"].get("ok", 0) > 0, data
    assert data["latency_max_s"] <= REQUEST_TIMEOUT_S, data
    # the guard watched through the run, did not trip, and vLLM is still up and healthy
    assert data["guard_seen_in_every_sample"], "the memory guard was not running"
    hf_home = shared_server.env["HF_HOME"]
    state = guard_state(hf_home)
    assert state["watching"] == 1 and state["tripped"] is None, state
    assert not marker_path(hf_home).exists()
    assert shared_server.proc.poll() is None
    assert shared_server.request("/health") == ""
    for name in ("vllm_rss", "guard_rss"):
        grew = data[name]["growth_pct"]
        assert grew is not None and grew <= RSS_GROWTH_BOUND_PCT, (name, data[name])
