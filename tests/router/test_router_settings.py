"""What `sparkserve router` runs with (sparkserve.router.settings): the registry's defaults, each
knob's rule, ROUTER_WORKERS required and normalised, the server's exposure rule (no key beyond
loopback) and the Host names the gate answers to."""

from __future__ import annotations

import pytest

from sparkserve.knobs.registry import IMAGE_ENV, KnobError
from sparkserve.router.settings import router_settings

WORKERS = {"ROUTER_WORKERS": "http://Spark-1:8000/ http://10.0.0.2:8000"}


def test_defaults() -> None:
    settings = router_settings({**WORKERS, IMAGE_ENV: "cpu"})  # in the image: HOST 0.0.0.0
    assert settings.workers == ("http://spark-1:8000", "http://10.0.0.2:8000")
    assert settings.policy == "cache_aware"
    assert (settings.port, settings.metrics_port) == (8001, 29000)
    assert (settings.health_interval_s, settings.health_failures) == (2, 2)
    assert settings.fleet_check_s == 30
    assert settings.host == "0.0.0.0" and settings.api_key == ""
    assert settings.allowed_hosts == "127.0.0.1" and settings.max_request_mb == 8
    assert settings.metrics_open is False
    assert router_settings({**WORKERS, IMAGE_ENV: "cpu", "METRICS_OPEN": "1"}).metrics_open


def test_no_workers_is_refused_in_one_line() -> None:
    for env in ({}, {"ROUTER_WORKERS": "  "}):
        with pytest.raises(KnobError, match=r"^ROUTER_WORKERS is empty: name each replica"):
            router_settings({**env, IMAGE_ENV: "cpu"})
    with pytest.raises(KnobError, match=r"^ROUTER_WORKERS: no worker URL given; allowed: one"):
        router_settings({"ROUTER_WORKERS": " , ", IMAGE_ENV: "cpu"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ROUTER_WORKERS": "http://a:8000 http://A:8000/"}, "ROUTER_WORKERS: worker URL "
         "'http://A:8000/': the same replica as 'http://a:8000'"),
        ({"ROUTER_POLICY": "kv_aware"}, "ROUTER_POLICY='kv_aware': must be one of cache_aware, "
         "power_of_two, round_robin, consistent_hash, random"),
        ({"ROUTER_PORT": "0"}, "ROUTER_PORT='0': must be an integer from 1 to 65535"),
        ({"ROUTER_HEALTH_FAILURES": "11"}, "ROUTER_HEALTH_FAILURES='11': must be an integer "
         "from 1 to 10"),
        ({"ROUTER_HEALTH_INTERVAL_S": "0.5"}, "ROUTER_HEALTH_INTERVAL_S='0.5': must be an "
         "integer from 1 to 300"),
        ({"METRICS_OPEN": "yes"}, "METRICS_OPEN='yes': must be 0 or 1"),
        ({"BIND_ADDRESS": "0.0.0.0"}, "BIND_ADDRESS='0.0.0.0' publishes the router beyond this "
         "machine without API_KEY"),
    ],
)  # fmt: skip
def test_a_bad_knob_is_refused_naming_it(env: dict[str, str], message: str) -> None:
    with pytest.raises(KnobError) as refused:
        router_settings({**WORKERS, IMAGE_ENV: "cpu", **env})
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


def test_a_router_on_a_host_binding_beyond_loopback_needs_the_key() -> None:
    with pytest.raises(KnobError, match=r"^HOST='0.0.0.0' binds the router beyond this machine"):
        router_settings(WORKERS)  # no SPARKSERVE_IMAGE: a run on the host
    assert router_settings({**WORKERS, "HOST": "127.0.0.1"}).host == "127.0.0.1"
    assert router_settings({**WORKERS, "API_KEY": "k"}).api_key == "k"
    assert router_settings({**WORKERS, IMAGE_ENV: "spark"}).host == "0.0.0.0"


def test_the_gate_answers_to_the_servers_names() -> None:
    env = {**WORKERS, "API_KEY": "k", "BIND_ADDRESS": "0.0.0.0", "HOST": "0.0.0.0"}
    assert router_settings(env).allowed_hosts == ""
    env["ALLOWED_HOSTS"] = "router.lan,10.0.0.9"
    assert router_settings(env).allowed_hosts == "router.lan,10.0.0.9"
    env["BIND_ADDRESS"] = "10.0.0.9"
    assert router_settings(env).allowed_hosts == "10.0.0.9,router.lan"
    env["ALLOWED_HOSTS"] = "*"
    assert router_settings(env).allowed_hosts == "*"
