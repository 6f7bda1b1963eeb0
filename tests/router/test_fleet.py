"""`sparkserve doctor --fleet` against three real vLLM CPU servers (serve.sh over the tiny plain
target, API_KEY set): two alike (the router tests' replicas, tests/router/conftest.py) and a
third with another served name, max_model_len, prefix caching off and n-gram speculation. The
odd one is named with each field that differs and both values, by majority whatever the order;
the two alike pass (from ROUTER_WORKERS, the key from the environment or an --env-file); a
missing or wrong key is a 401 row; a stopped replica is unreachable, and so is one that accepts
the connection but never answers (a listening socket nobody reads: a hung host) once
--fleet-timeout passes. Each verdict comes from what the servers answer on /health,
/v1/models, /version and /metrics."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkserve.doctor.fleet import ALL_CLEAR
from support.replicas import REPLICA_KEY as KEY
from support.replicas import Replicas, replica
from support.vllm_server import VllmServer

REPO = Path(__file__).resolve().parents[2]
ODD = {  # the third replica's knobs: each a field the doctor must name
    "SERVED_MODEL_NAME": "tiny-other",
    "MAX_MODEL_LEN": "2048",
    "PREFIX_CACHE": "0",
    "SPEC_METHOD": "ngram",  # speculation with no drafter: 3 tokens a step
    "NUM_SPEC_TOKENS": "3",
}
ODD_DIFFERENCES = (
    "differs: model: here tiny-other, fleet tiny; max_model_len: here 2048, fleet 4096; "
    "speculative_tokens: here 3, fleet 0; enable_prefix_caching: here False, fleet True"
)


@pytest.fixture(scope="module")
def fleet(
    shared_replicas: Replicas,
    tiny_models: dict[str, str],
    sparkserve_site: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[VllmServer]]:
    """[alike, alike, odd]: the router tests' two replicas and a third, odd, of their kind."""
    odd = Replicas([replica(tmp_path_factory.mktemp("fleet-odd"), tiny_models, sparkserve_site,
                            ODD)])  # fmt: skip
    try:
        odd.start()  # while the two start, if they are not up yet
        yield [*shared_replicas.get(), *odd.get()]
    finally:
        odd.stop()


def doctor(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`sparkserve doctor` with `env` over this process's environment less the knobs named."""
    base = {k: v for k, v in os.environ.items() if k not in ("API_KEY", "ROUTER_WORKERS")}
    base.update(PYTHONPATH=str(REPO / "src"), **env)
    return subprocess.run(
        [sys.executable, "-m", "sparkserve", "doctor", *args],
        capture_output=True, text=True, env=base, timeout=120, check=False,
    )  # fmt: skip


def rows(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    assert done.stderr == ""
    return {row["name"]: row for row in json.loads(done.stdout)}


def urls(*servers: VllmServer) -> list[str]:
    return [server.base_url for server in servers]


@pytest.mark.e2e
def test_the_odd_replica_is_named_with_each_field_and_both_values(
    fleet: list[VllmServer],
) -> None:
    a, b, odd = fleet
    for order in ((a, b, odd), (odd, a, b)):  # the majority decides, not the first
        done = doctor("--fleet", *urls(*order), "--json", env={"API_KEY": KEY})
        found = rows(done)
        print(json.dumps(found, indent=1))
        assert done.returncode == 1
        assert found[odd.base_url] == {
            "name": odd.base_url, "status": "blocker", "detail": ODD_DIFFERENCES,
        }  # fmt: skip
        for alike in (a, b):
            assert found[alike.base_url]["status"] == "ok"
            assert found[alike.base_url]["detail"].startswith("serves tiny (")
            assert "max_model_len 4096" in found[alike.base_url]["detail"]
    table = doctor("--fleet", *urls(a, odd, b), env={"API_KEY": KEY})
    print(table.stdout)
    assert table.returncode == 1
    assert table.stdout.splitlines()[-1] == f"blockers: {odd.base_url}"


@pytest.mark.e2e
def test_with_two_a_tie_goes_to_the_earliest(fleet: list[VllmServer]) -> None:
    a, _, odd = fleet
    found = rows(doctor("--fleet", *urls(a, odd), "--json", env={"API_KEY": KEY}))
    assert (found[a.base_url]["status"], found[odd.base_url]["status"]) == ("ok", "blocker")
    found = rows(doctor("--fleet", *urls(odd, a), "--json", env={"API_KEY": KEY}))
    assert (found[odd.base_url]["status"], found[a.base_url]["status"]) == ("ok", "blocker")
    assert found[a.base_url]["detail"].startswith("differs: model: here tiny, fleet tiny-other;")


@pytest.mark.e2e
def test_replicas_alike_pass_from_router_workers(fleet: list[VllmServer]) -> None:
    a, b, _ = fleet
    done = doctor("--fleet", env={"API_KEY": KEY, "ROUTER_WORKERS": ",".join(urls(a, b))})
    print(done.stdout)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[-1] == ALL_CLEAR


@pytest.mark.e2e
def test_the_key_comes_from_an_env_file(fleet: list[VllmServer], tmp_path: Path) -> None:
    a, b, _ = fleet
    env_file = tmp_path / ".env"
    env_file.write_text(f"API_KEY={KEY}\nROUTER_WORKERS={a.base_url} {b.base_url}\n")
    done = doctor("--fleet", "--env-file", str(env_file), env={})
    print(done.stdout)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[-1] == ALL_CLEAR


@pytest.mark.e2e
def test_a_missing_or_wrong_key_is_a_401_row(fleet: list[VllmServer]) -> None:
    a = fleet[0]
    for env, why in (
        ({}, "no API_KEY is set here"),
        ({"API_KEY": "not-the-key"}, "the API_KEY here is not this replica's"),
    ):
        done = doctor("--fleet", a.base_url, "--json", env=env)
        assert done.returncode == 1
        assert rows(done)[a.base_url] == {
            "name": a.base_url, "status": "blocker", "detail": f"HTTP 401 on /v1/models: {why}",
        }  # fmt: skip


def test_a_bad_replica_url_is_one_line() -> None:
    done = doctor("--fleet", "http://127.0.0.1:8000", "http://replica", env={})
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(
        "sparkserve doctor: --fleet: worker URL 'http://replica': no port"
    )
    assert len(done.stderr.splitlines()) == 1


def test_no_replica_at_all_is_one_line() -> None:
    done = doctor("--fleet", env={})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "sparkserve doctor: --fleet: no replica: name their URLs after --fleet or set "
        "ROUTER_WORKERS\n"
    )


@pytest.mark.e2e
def test_a_stopped_replica_is_unreachable(fleet: list[VllmServer]) -> None:
    """Last: it stops the odd replica."""
    a, b, odd = fleet
    odd.stop()
    done = doctor("--fleet", *urls(a, b, odd), "--json", env={"API_KEY": KEY})
    found = rows(done)
    assert done.returncode == 1
    assert found[odd.base_url]["status"] == "blocker"
    assert found[odd.base_url]["detail"] == (
        "unreachable: GET /health: connection refused (nothing listens there: stopped?)"
    )
    assert [found[s.base_url]["status"] for s in (a, b)] == ["ok", "ok"]


def test_a_replica_that_never_answers_is_unreachable_after_the_timeout() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen()  # the kernel accepts the connection; nothing ever reads or answers
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        done = doctor("--fleet", url, "--fleet-timeout", "1", "--json", env={})
    assert done.returncode == 1
    assert rows(done)[url] == {
        "name": url, "status": "blocker", "detail": "unreachable: GET /health: timed out",
    }  # fmt: skip
