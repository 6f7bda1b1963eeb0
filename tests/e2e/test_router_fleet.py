"""N Sparks as N replicas, on the real Docker Engine: three replicas, each the `sparkserve`
service of docker-compose.yml in a compose project of its own (one per Spark: its own .env,
model cache and container), and the `router` service of the `router` profile in front, all on
the test's own Docker network (each replica under its Spark's name, spark-1..3), published on
loopback only. Each replica is configured as docs/CLUSTER.md tells a user: API_KEY,
ALLOWED_HOSTS=its name, EXTRA_ARGS=--enable-scale-out (cache_aware's render routes); BIND_ADDRESS
stays loopback (nothing here is reached from beyond this machine: the router reaches the
replicas on the test network). The router keeps the registry's defaults (cache_aware, health
every 2 s, out after 2 failures).

An override file changes only what this machine must: the cpu image (no GPU: the GPU
reservation, the host's IPC and the memlock ulimit reset, a private /dev/shm), the test network,
the tiny model's knobs, the test-only vLLM shims.

  1. 10 conversations x 6 turns (a growing shared prefix) through the router under cache_aware:
     every turn of a conversation lands on one replica, and the conversations sit on more than
     one replica; the replicas' prefix-cache hits summed exceed the same workload's under
     round_robin (the router alone restarted with ROUTER_POLICY=round_robin). Attribution: the
     first turns go three at once (the router spreads them by its in-flight counts), every later
     turn alone, so the router's per-replica count before and after it names its replica; a
     first turn is placed by the replica whose prefix cache the second turn hits (no other
     replica's hits move). Fairness: both runs send the same shapes (turns, lengths, max_tokens,
     order), but each run's conversations open with text of their own, so no block cached by
     the first run can be hit by the second. Both runs' figures go to a JSON in the test's tmp
     dir (printed).
  2. a replica's container SIGKILLed while streams run: the streams it held fail (how the client
     sees it is recorded), no request sent after the kill is lost (the router tries again on
     the others what it tried on the dead replica: its circuit opens after 3 failed attempts,
     src/sparkserve/router/command.py), the two others answer; timed from the kill to the
     replica out of rotation (circuit open or health gauge at 0), to the health gauge at 0 and
     to the router's last routing there.
  3. a replica drained on purpose (`sparkserve router drain URL` in the router's container),
     then `docker compose stop` while streams run: no client sees an error, it gets no request
     after the drain; started again and `sparkserve router add URL`, it serves again.
  4. test 2's replica, brought back by Docker's restart policy (exit 137, restarted while test 3
     ran), is back in the router's rotation and gets requests again.
  5. spark-4 (MAX_MODEL_LEN differs; started beside tests 1-4): `sparkserve doctor --fleet` in
     the router's container refuses the fleet (exit 1) naming spark-4 and max_model_len, and
     passes the three alike (exit 0). vllm-router 0.1.17 checks only /health, so `sparkserve
     router add` takes it in; the router's fleet watch (ROUTER_FLEET_CHECK_S, its default 30 s)
     takes it out again at its next check, the router's /health stays 200 and names it with
     max_model_len, and under load it gets no request.

Not shown: a Spark, the Spark image, several machines (one Docker host here), a network between
them that fails (the replicas' containers are killed or stopped instead).
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sparkserve.client.metrics import parse as parse_metrics
from support.compose_project import (
    ComposeError,
    ComposeProject,
    docker,
    docker_time,
    install_shims,
    place_in_hf_cache,
    seed_model_infos,
)
from support.cpu_launch import TEST_SERVER_ENV
from support.vllm_server import free_port, metric_sum

REPLICA = "sparkserve"  # docker-compose.yml's service, unchanged
ROUTER = "router"
SHIMS_IN_CONTAINER = "/opt/sparkserve-test-shims"
MODEL_REPO = "sparkserve-test/tiny-qwen3"
MODEL = "tiny"
KEY = "fleet-test-key-1"
MAX_MODEL_LEN = 2048
ODD_MAX_MODEL_LEN = 1024  # spark-4's: another setting, the same model
NAMES = ("spark-1", "spark-2", "spark-3")
ODD = "spark-4"
START_GUARD_S = 600  # four vLLM replicas starting on two shared cores: a guard against a hang
ROUTER_GUARD_S = 120
DETECT_GUARD_S = 60  # the router's health loop: 2 checks 2 s apart, plus its 3 s timeout
CONVERSATIONS, TURNS = 10, 6
OPENERS = 3  # first turns sent at once
TIMINGS: dict[str, float] = {}
FIGURES: dict[str, object] = {}
REACHED: set[str] = set()

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not os.environ.get("SPARKSERVE_CPU_IMAGE"),
        reason="SPARKSERVE_CPU_IMAGE is unset: ./scripts/test.sh builds the cpu image and starts "
        "the suite's Docker Engine (set SPARKSERVE_CONTAINER_TESTS=0 there to skip it)",
    ),
]


def needs(step: str) -> None:
    if step not in REACHED:
        pytest.skip(f"needs {step!r}, which did not pass")


# ---------------------------------------------------------------------------------------------
# the fleet


@dataclass
class Replica:
    name: str
    project: ComposeProject

    @property
    def port(self) -> int:
        return int(self.project.env["PORT"])

    @property
    def url(self) -> str:
        """The replica as the router names it: its Spark's name on the network, its PORT."""
        return f"http://{self.name}:{self.port}"

    def metrics(self) -> dict:
        status, text = get(self.port, "/metrics")
        assert status == 200, text
        return parse_metrics(text)

    def answers(self) -> bool:
        try:
            return get(self.port, "/health", timeout=5)[0] == 200
        except OSError:
            return False


@dataclass
class Fleet:
    network: str
    replicas: list[Replica]
    odd: Replica
    router: ComposeProject
    work: Path
    odd_started: threading.Thread  # spark-4 starts beside the tests before test 5

    @property
    def port(self) -> int:
        return int(self.router.env["ROUTER_PORT"])

    @property
    def metrics_port(self) -> int:
        return int(self.router.env["ROUTER_METRICS_PORT"])

    @property
    def block_size(self) -> int:
        """The replicas' KV block size (vllm:cache_config_info), the prefix cache's unit."""
        metrics = self.replicas[0].metrics()
        labels = next(dict(labels) for (n, labels) in metrics if n == "vllm:cache_config_info")
        return int(labels["block_size"])

    def router_metrics(self) -> dict:
        status, text = get(self.metrics_port, "/metrics", key=None)
        assert status == 200, text
        return parse_metrics(text)

    def processed(self, metrics: dict | None = None) -> dict[str, float]:
        metrics = metrics if metrics is not None else self.router_metrics()
        return {r.url: metric_sum(metrics, "vllm_router_processed_requests_total", worker=r.url)
                for r in (*self.replicas, self.odd)}  # fmt: skip

    def health(self, replica: Replica, metrics: dict | None = None) -> float | None:
        metrics = metrics if metrics is not None else self.router_metrics()
        gauge = "vllm_router_worker_health"
        found = [v for (n, labels), v in metrics.items()
                 if n == gauge and ("worker", replica.url) in labels]  # fmt: skip
        return found[-1] if found else None

    def circuit(self, replica: Replica, metrics: dict) -> float | None:
        found = [v for (n, labels), v in metrics.items()
                 if n == "vllm_router_cb_state" and ("worker", replica.url) in labels]  # fmt: skip
        return found[-1] if found else None

    def admin(self, *args: str) -> subprocess.CompletedProcess:
        """`sparkserve router ARGS` or another sparkserve command in the router's container."""
        return self.router.compose("exec", "-T", ROUTER, "python3", "-m", "sparkserve", *args,
                                   check=False, timeout=700)  # fmt: skip

    def restart_router(self, **knobs: str) -> float:
        started = time.monotonic()
        self.router.write_env(**knobs)
        self.router.compose("up", "-d", "--no-build", "--force-recreate", ROUTER)
        wait_router_ready(self, [r.url for r in self.replicas])
        return time.monotonic() - started


def get(port: int, path: str, key: str | None = KEY, timeout: float = 30) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        connection.request("GET", path, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    finally:
        connection.close()


def replica_override(name: str, network: str, shims: Path) -> str:
    """The `sparkserve` service as this machine can run it (the pair test's override too):
    the cpu image, no GPU reservation, no host IPC, no memlock, on the fleet network as its
    Spark's name. YAML with Compose's `!reset` tags (JSON is YAML; the tags go in unquoted)."""
    image = os.environ["SPARKSERVE_CPU_IMAGE"]
    override = {
        "networks": {"fleet": {"name": network, "external": True}},
        "services": {
            REPLICA: {
                "image": image,
                "deploy": "!reset",
                "ipc": "!reset",
                "ulimits": "!reset",  # this sandbox may not raise memlock
                "shm_size": "1gb",
                "networks": {"fleet": {"aliases": [name]}},
                "environment": {"PYTHONPATH": SHIMS_IN_CONTAINER, **TEST_SERVER_ENV},
                "volumes": [f"{shims}:{SHIMS_IN_CONTAINER}:ro"],
            },
            f"{REPLICA}-fetch": {"image": image},
        },
    }
    return json.dumps(override, indent=1).replace('"!reset"', "!reset null")


def router_override(network: str) -> str:
    override = {
        "networks": {"fleet": {"name": network, "external": True}},
        "services": {ROUTER: {"image": os.environ["SPARKSERVE_CPU_IMAGE"],
                              "networks": {"fleet": {}}}},
    }  # fmt: skip
    return json.dumps(override, indent=1)


def replica_project(name: str, work: Path, network: str, shims: Path, model: Path,
                    max_model_len: int) -> Replica:  # fmt: skip
    project = ComposeProject(name=f"sparkserve-fleet-{name.split('-')[1]}-{os.getpid()}",
                             work=work / name, profiles=())  # fmt: skip
    project.override_text = replica_override(name, network, shims)
    project.write_env(
        MODEL=MODEL_REPO, SERVED_MODEL_NAME=MODEL, HF_OFFLINE="1", THINKING="0",
        MAX_MODEL_LEN=str(max_model_len), KV_CACHE_GB="0.25", MAX_NUM_SEQS="3",
        OS_RESERVE_GB="4", SHUTDOWN_TIMEOUT_S="15",
        # docs/CLUSTER.md's replica .env; BIND_ADDRESS stays loopback here (see the docstring)
        API_KEY=KEY, ALLOWED_HOSTS=name, BIND_ADDRESS="127.0.0.1",
        EXTRA_ARGS="--enforce-eager --enable-scale-out",
    )  # fmt: skip
    project.remove()
    seed_model_infos(project.volume_path("hf-cache"))
    place_in_hf_cache(project.volume_path("hf-cache") / "hub", MODEL_REPO, model)
    return Replica(name, project)


ODD_START_ERRORS: list[Exception] = []


def start_odd(odd: Replica) -> None:
    try:
        odd.project.up(REPLICA)
    except Exception as error:  # test 5 reports it
        ODD_START_ERRORS.append(error)


def wait_router_ready(fleet: Fleet, urls: list[str]) -> None:
    """The gate's /health 200 and every replica in `urls` at health 1 in the router's metrics."""
    deadline = time.monotonic() + ROUTER_GUARD_S
    last = ""
    while time.monotonic() < deadline:
        try:
            status, last = get(fleet.port, "/health", key=None, timeout=5)
            if status == 200:
                metrics = fleet.router_metrics()
                healthy = {u for (n, labels), v in metrics.items()
                           if n == "vllm_router_worker_health" and v == 1
                           for k, u in labels if k == "worker"}  # fmt: skip
                if set(urls) <= healthy:
                    return
        except (OSError, AssertionError, http.client.HTTPException) as error:
            last = repr(error)
        time.sleep(0.3)
    raise ComposeError(f"router not ready in {ROUTER_GUARD_S} s ({last})\n"
                       f"{fleet.router.logs(ROUTER)[-4000:]}")  # fmt: skip


def wait_answering(replicas: list[Replica], guard_s: float) -> float:
    started = time.monotonic()
    waiting = list(replicas)
    while waiting and time.monotonic() - started < guard_s:
        waiting = [r for r in waiting if not r.answers()]
        time.sleep(0.5)
    if waiting:
        logs = "\n".join(f"--- {r.name}\n{r.project.logs(REPLICA)[-3000:]}" for r in waiting)
        raise ComposeError(f"not answering after {guard_s} s: {[r.name for r in waiting]}\n{logs}")
    return time.monotonic() - started


@pytest.fixture(scope="module")
def fleet(
    tiny_models: dict[str, str], cpu_venv_python: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    module_started = time.monotonic()
    work = tmp_path_factory.mktemp("router-fleet")
    shims = install_shims(cpu_venv_python, work / "shims")
    router_name = f"sparkserve-fleet-router-{os.getpid()}"
    network = f"{router_name}_fleet"  # named after the router's project: removed with its orphans
    model = Path(tiny_models["plain"])
    docker("network", "rm", network, check=False)
    docker("network", "create", network)
    replicas = [replica_project(n, work, network, shims, model, MAX_MODEL_LEN) for n in NAMES]
    odd = replica_project(ODD, work, network, shims, model, ODD_MAX_MODEL_LEN)
    router = ComposeProject(name=router_name, work=work / "router", profiles=("router",))
    router.override_text = router_override(network)
    odd_started = threading.Thread(target=start_odd, args=(odd,), daemon=True)
    fleet = Fleet(network, replicas, odd, router, work, odd_started)
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(3) as pool:  # in parallel, as three Sparks start
            list(pool.map(lambda r: r.project.up(REPLICA), replicas))
        wait_answering(replicas, START_GUARD_S)
        TIMINGS["replicas_up_to_answering_s"] = time.monotonic() - started
        router.write_env(
            API_KEY=KEY, BIND_ADDRESS="127.0.0.1", ROUTER_PORT=str(free_port()),
            ROUTER_METRICS_PORT=str(free_port()),
            ROUTER_WORKERS=",".join(r.url for r in replicas),
        )  # fmt: skip
        started = time.monotonic()
        router.compose("up", "-d", "--no-build", ROUTER)
        wait_router_ready(fleet, [r.url for r in replicas])
        TIMINGS["router_up_to_ready_s"] = time.monotonic() - started
        odd_started.start()  # its start overlaps tests 1-4
        yield fleet
    finally:
        if odd_started.ident is not None:
            odd_started.join(300)
        TIMINGS["module_s"] = time.monotonic() - module_started
        print(f"\nrouter fleet timings (s): {json.dumps(TIMINGS)}")
        print(f"router fleet figures: {json.dumps(FIGURES)}")
        router.remove()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda r: r.project.remove(), [*replicas, odd]))
        docker("network", "rm", network, check=False)


# ---------------------------------------------------------------------------------------------
# clients


@dataclass
class Outcome:
    """One request through the router, as its client saw it."""

    started: float  # time.time()
    ended: float = 0.0
    status: int = 0
    body: str = ""  # the answer's text when it was not a stream of events (an error)
    events: int = 0
    done: bool = False  # `data: [DONE]`
    finish_reason: str = ""
    sse_errors: list[dict] = field(default_factory=list)
    failure: str = ""  # the connection broke

    @property
    def ok(self) -> bool:
        return (self.status == 200 and self.done and not self.sse_errors and not self.failure
                and self.finish_reason in ("length", "stop"))  # fmt: skip

    def seen(self) -> str:
        """How the client saw a failure, in one line."""
        if self.status != 200:
            return f"HTTP {self.status}: {self.body.strip()[:200]}"
        if self.sse_errors:
            return f"error event after {self.events} events: {self.sse_errors[-1]}"
        if self.failure:
            return f"the stream broke after {self.events} events: {self.failure}"
        return f"the stream ended after {self.events} events without [DONE]"


def take_event(outcome: Outcome, line: str) -> None:
    if line == "data: [DONE]":
        outcome.done = True
    elif line.startswith("data: {"):
        event = json.loads(line.removeprefix("data: "))
        outcome.events += 1
        if "error" in event:
            outcome.sse_errors.append(event["error"])
        for choice in event.get("choices", []):
            outcome.finish_reason = choice.get("finish_reason") or outcome.finish_reason


def stream_chat(port: int, content: str, max_tokens: int) -> Outcome:
    outcome = Outcome(started=time.time())
    body = {"model": MODEL, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "messages": [{"role": "user", "content": content}]}  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(body),
                           {"Content-Type": "application/json",
                            "Authorization": f"Bearer {KEY}"})  # fmt: skip
        answer = connection.getresponse()
        outcome.status = answer.status
        if answer.status != 200:
            outcome.body = answer.read().decode(errors="replace")
            return outcome
        # read1, not line iteration: iterating an HTTPResponse ends quietly on a chunked body
        # cut short (its peek swallows the IncompleteRead); read1 raises it
        pending = b""
        while chunk := answer.read1(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                take_event(outcome, raw.decode(errors="replace").strip())
    except (OSError, http.client.HTTPException, ValueError) as error:
        outcome.failure = repr(error)
    finally:
        outcome.ended = time.time()
        connection.close()
    return outcome


def chat(port: int, messages: list[dict], max_tokens: int = 8) -> dict:
    body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "messages": messages}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(body),
                           {"Content-Type": "application/json",
                            "Authorization": f"Bearer {KEY}"})  # fmt: skip
        answer = connection.getresponse()
        text = answer.read().decode(errors="replace")
        assert answer.status == 200, f"HTTP {answer.status}: {text}"
        return dict(json.loads(text))
    finally:
        connection.close()


class Load:
    """`clients` threads, each sending streamed chats one after another until stopped; every
    request's outcome kept."""

    def __init__(self, port: int, clients: int, max_tokens: int, tag: str) -> None:
        self.port, self.max_tokens, self.tag = port, max_tokens, tag
        self.outcomes: list[Outcome] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True)
                        for i in range(clients)]  # fmt: skip

    def client(self, index: int) -> None:
        n = 0
        while not self.stopping.is_set():
            n += 1
            # a text of its own: the router routes by load, not by a shared prefix
            opening = f"{self.tag} client {index} request {n}: "
            content = opening + words(40, opening)
            outcome = stream_chat(self.port, content, self.max_tokens)
            with self.lock:
                self.outcomes.append(outcome)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(180)


VOCABULARY = ("cache", "spark", "router", "token", "prefix", "replica", "stream", "model",
              "turn", "health", "drain", "block", "queue", "metric", "policy")  # fmt: skip


def words(count: int, seed: str) -> str:
    chooser = random.Random(seed)
    return " ".join(f"{chooser.choice(VOCABULARY)}{chooser.randrange(100)}" for _ in range(count))


def wait_for(what: str, check, guard_s: float, every_s: float = 0.25):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + guard_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {guard_s} s")


# ---------------------------------------------------------------------------------------------
# 1. conversations


def opening(tag: str, c: int) -> str:
    """A conversation's first turn: a long context of its own that its later turns carry."""
    return f"{tag} conversation {c}. " + words(160, f"{tag}-{c}")


def hits_by_replica(fleet: Fleet) -> dict[str, float]:
    return {r.url: metric_sum(r.metrics(), "vllm:prefix_cache_hits_total") for r in fleet.replicas}


def run_conversations(fleet: Fleet, tag: str) -> dict:
    """CONVERSATIONS x TURNS, turn by turn across the conversations. The first turns go OPENERS
    at a time (the router spreads them by its in-flight counts); every later turn is sent
    alone, so the router's per-replica count before and after it names the replica that served
    it. A first turn is placed by the second: the replica serving the second turn alone hits
    the first turn's prompt in its prefix cache (its text is the conversation's own: no other
    replica can hold it), and no other replica's hits move meanwhile."""
    urls = [r.url for r in fleet.replicas]
    block = fleet.block_size
    before = {r.url: r.metrics() for r in fleet.replicas}
    histories: list[list[dict]] = [[] for _ in range(CONVERSATIONS)]
    served: list[list[str]] = [[] for _ in range(CONVERSATIONS)]
    first_prompt_tokens = [0] * CONVERSATIONS
    started = time.monotonic()

    def first_turn(c: int) -> None:
        histories[c].append({"role": "user", "content": opening(tag, c)})
        answer = chat(fleet.port, histories[c])
        first_prompt_tokens[c] = answer["usage"]["prompt_tokens"]
        reply = answer["choices"][0]["message"]["content"] or ""
        histories[c].append({"role": "assistant", "content": reply})

    for group in range(0, CONVERSATIONS, OPENERS):
        with ThreadPoolExecutor(OPENERS) as pool:
            list(pool.map(first_turn, range(group, min(group + OPENERS, CONVERSATIONS))))
    counts = fleet.processed()
    for turn in range(1, TURNS):
        for c in range(CONVERSATIONS):
            text = f"turn {turn}: " + words(24, f"{tag}-{c}-{turn}")
            histories[c].append({"role": "user", "content": text})
            hits = hits_by_replica(fleet) if turn == 1 else {}
            answer = chat(fleet.port, histories[c])
            reply = answer["choices"][0]["message"]["content"] or ""
            histories[c].append({"role": "assistant", "content": reply})
            after = fleet.processed()
            moved = [u for u in urls if after[u] > counts[u]]
            assert len(moved) == 1 and after[moved[0]] == counts[moved[0]] + 1, (counts, after)
            if turn == 1:
                hit = {u: v - hits[u] for u, v in hits_by_replica(fleet).items()}
                if hit[moved[0]] >= first_prompt_tokens[c] - block:
                    served[c].append(moved[0])  # its first turn was served there
                else:
                    served[c].append("elsewhere")
                assert all(v == 0 for u, v in hit.items() if u != moved[0]), hit
            served[c].append(moved[0])
            counts = after
    wall = time.monotonic() - started
    result: dict = {"policy": tag, "wall_s": round(wall, 2), "served": served}
    totals = {"hits": 0.0, "queries": 0.0, "successes": 0.0}
    for replica in fleet.replicas:
        now, then = replica.metrics(), before[replica.url]
        delta = {
            name: metric_sum(now, metric) - metric_sum(then, metric)
            for name, metric in (("hits", "vllm:prefix_cache_hits_total"),
                                 ("queries", "vllm:prefix_cache_queries_total"),
                                 ("successes", "vllm:request_success_total"))
        }  # fmt: skip
        result[replica.name] = delta
        for name in totals:
            totals[name] += delta[name]
    result.update(totals)
    result["conversations_on_one_replica"] = sum(len(set(s)) == 1 for s in served)
    result["replicas_holding_conversations"] = len({s[-1] for s in served})
    # every request counted once, by the replicas themselves
    assert result["successes"] == CONVERSATIONS * TURNS, result
    return result


def test_1_conversations_stay_on_one_replica_and_hit_more_than_round_robin(
    fleet: Fleet, tmp_path: Path
) -> None:
    cache_aware = run_conversations(fleet, "cache_aware")
    FIGURES["cache_aware"] = {k: v for k, v in cache_aware.items() if k != "served"}
    TIMINGS["router_restart_round_robin_s"] = fleet.restart_router(ROUTER_POLICY="round_robin")
    round_robin = run_conversations(fleet, "round_robin")
    FIGURES["round_robin"] = {k: v for k, v in round_robin.items() if k != "served"}
    TIMINGS["router_restart_cache_aware_s"] = fleet.restart_router(ROUTER_POLICY="cache_aware")
    report = {
        "workload": {"conversations": CONVERSATIONS, "turns": TURNS, "max_tokens": 8,
                     "replicas": len(fleet.replicas),
                     "order": "turn by turn; first turns 3 at once, the rest one at a time",
                     "fairness": "same shapes; each run's conversations open with their own "
                                 "text, so no block of one run is hit by the other"},
        "cache_aware": cache_aware,
        "round_robin": round_robin,
    }  # fmt: skip
    path = tmp_path / "router_policies.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"\n{path}:\n{json.dumps(report)}")
    for c, replicas in enumerate(cache_aware["served"]):
        assert len(set(replicas)) == 1, f"conversation {c} moved: {replicas}"
    # the conversations sit on more than one replica: staying is the policy's doing, not a
    # router that sends everything to one
    assert cache_aware["replicas_holding_conversations"] >= 2, cache_aware
    assert cache_aware["queries"] == pytest.approx(round_robin["queries"], rel=0.05), report
    assert cache_aware["hits"] > round_robin["hits"], report
    spread = [len(set(s)) for s in round_robin["served"]]
    assert max(spread) > 1, "round_robin moved no conversation: the comparison shows nothing"
    REACHED.add("fleet")


# ---------------------------------------------------------------------------------------------
# 2. a replica killed under load


def kill_container(pid: int) -> float:
    """SIGKILL the container's init (its pid 1) from the host, as a crash or the kernel's OOM
    killer ends it: Docker records exit 137 and its restart policy applies (after a `docker
    kill` it would not: Docker takes that as a stop by hand and disables the restart policy
    until the container is started again)."""
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    return killed_at


KILLED: dict[str, object] = {}


@dataclass
class Sample:
    """The router's view of one replica at a time.time()."""

    at: float
    health: float | None  # vllm_router_worker_health
    circuit: float | None  # vllm_router_cb_state: 0 closed, 1 open, 2 half open
    processed: float  # vllm_router_processed_requests_total


def test_2_a_killed_replica_fails_only_the_requests_it_held(fleet: Fleet) -> None:
    needs("fleet")
    victim, others = fleet.replicas[1], [fleet.replicas[0], fleet.replicas[2]]
    state = victim.project.state(REPLICA)
    KILLED["first_start"], pid = state["StartedAt"], int(state["Pid"])
    samples: list[Sample] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            metrics = fleet.router_metrics()
            samples.append(Sample(time.time(), fleet.health(victim, metrics),
                                  fleet.circuit(victim, metrics),
                                  fleet.processed(metrics)[victim.url]))  # fmt: skip
            time.sleep(0.2)

    def first(test) -> float | None:  # type: ignore[no-untyped-def]
        return next((x.at for x in samples if x.at > killed_at and test(x)), None)

    sampler = threading.Thread(target=sample, daemon=True)
    # streams long enough to be in flight on the victim at the kill (with 256 tokens, one seen
    # running had ended by then in a run on this machine)
    with Load(fleet.port, clients=3, max_tokens=1024, tag="kill") as load:
        sampler.start()
        running = "vllm:num_requests_running"
        wait_for("a request running on the victim",
                 lambda: metric_sum(victim.metrics(), running) >= 1, 60, 0.05)  # fmt: skip
        killed_at = kill_container(pid)
        KILLED["at"] = killed_at
        # out of rotation: its circuit open (attempts that failed on it) or its health at 0
        noticed = wait_for("the victim out of the router's rotation",
                           lambda: first(lambda x: x.health == 0 or x.circuit == 1),
                           DETECT_GUARD_S)  # fmt: skip
        health_0 = wait_for("the router's health gauge at 0",
                            lambda: first(lambda x: x.health == 0), DETECT_GUARD_S)  # fmt: skip
        others_before = fleet.processed()
        time.sleep(5)  # the stream goes on against the two others
    sampling.set()
    sampler.join(10)
    others_after = fleet.processed()
    routed = [b.at for a, b in itertools.pairwise(samples)
              if b.processed > a.processed and b.at >= killed_at]  # fmt: skip
    last_routed = max(routed, default=killed_at)
    outcomes = load.outcomes
    failed = [o for o in outcomes if not o.ok]
    in_flight = [o for o in failed if o.started < killed_at]
    opened = first(lambda x: x.circuit == 1)
    FIGURES["kill"] = {
        "requests": len(outcomes),
        "sent_between_kill_and_noticed": sum(killed_at <= o.started <= noticed for o in outcomes),
        "started_after_noticed": sum(o.started > noticed for o in outcomes),
        "failed_in_flight_at_kill": [o.seen() for o in in_flight],
        "failed_sent_after_kill": [o.seen() for o in failed if o.started >= killed_at],
        "kill_to_out_of_rotation_s": round(noticed - killed_at, 2),
        "kill_to_circuit_open_s": None if opened is None else round(opened - killed_at, 2),
        "kill_to_health_0_s": round(health_0 - killed_at, 2),
        "kill_to_last_routed_s": round(last_routed - killed_at, 2),
    }
    # what the router's container logged about it: vllm-router's and the gate's side of it
    marks = ("Stream error", "Exception in ASGI", "RemoteProtocolError", "Failed to send")
    FIGURES["kill"]["router_log"] = [  # type: ignore[index]
        line[-300:] for line in fleet.router.logs(ROUTER).splitlines()
        if any(mark in line for mark in marks)
    ][-8:]  # fmt: skip
    TIMINGS["kill_to_out_of_rotation_s"] = noticed - killed_at
    TIMINGS["kill_to_health_0_s"] = health_0 - killed_at
    TIMINGS["kill_to_last_routed_s"] = last_routed - killed_at
    print(f"\nkilled replica: {json.dumps(FIGURES['kill'])}")
    # the streams the replica held when it died fail (how: FIGURES), and end: none hangs
    assert in_flight, f"nothing in flight on the victim failed: {FIGURES['kill']}"
    # no request that had not reached it is lost: every one sent after the kill is answered
    # (those the router tried on the dead replica were tried again on the others)
    sent_after = [o for o in outcomes if o.started >= killed_at]
    assert sent_after and all(o.ok for o in sent_after), FIGURES["kill"]
    # nothing routed to it once out of rotation (the sampling's own period aside)
    assert last_routed <= noticed + 0.5, FIGURES["kill"]
    # the others answered the stream after that (cache_aware may send it all to one of them:
    # CI's loaded run of 2026-12-06 had 2 more on one, none on the other)
    assert sum(others_after[r.url] - others_before[r.url] for r in others) > 0, others_after
    REACHED.add("killed")


# ---------------------------------------------------------------------------------------------
# 3. drain, stop, add


def test_3_a_drained_replica_stops_without_a_client_error_and_comes_back(fleet: Fleet) -> None:
    needs("fleet")
    victim = fleet.replicas[2]
    running = "vllm:num_requests_running"
    # long streams, so that one runs on the replica as the drain begins: the drain comes right
    # after the reading that saw it (a second reading just before the drain once read 0, the
    # stream already ended; after `router drain` returns, a loaded machine may have finished
    # it too, CI's case)
    seen: list[float] = []
    with Load(fleet.port, clients=3, max_tokens=512, tag="drain") as load:
        wait_for("a request running on the replica to drain",
                 lambda: seen.append(metric_sum(victim.metrics(), running)) or seen[-1] >= 1,
                 60, 0.05)  # fmt: skip
        drained = fleet.admin("router", "drain", victim.url)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        drained_count = fleet.processed()[victim.url]
        FIGURES["running_on_it_after_the_drain"] = metric_sum(victim.metrics(), running)
        started = time.monotonic()
        victim.project.compose("stop", REPLICA, timeout=200)
        TIMINGS["drained_replica_stop_s"] = time.monotonic() - started
        time.sleep(3)  # requests go on against the others
    outcomes = load.outcomes
    FIGURES["drain"] = {
        "requests": len(outcomes),
        "running_on_it_when_drained": seen[-1],
        "failed": [o.seen() for o in outcomes if not o.ok],
    }
    assert outcomes and all(o.ok for o in outcomes), FIGURES["drain"]
    assert fleet.processed()[victim.url] == drained_count, "routed to it after the drain"
    assert victim.project.state(REPLICA)["Status"] == "exited"
    listed = json.loads(fleet.admin("router", "workers").stdout)
    assert victim.url not in [w["url"] for w in listed], listed

    started = time.monotonic()
    victim.project.compose("start", REPLICA)
    added = fleet.admin("router", "add", victim.url)  # waits for its /health
    assert added.returncode == 0, added.stdout + added.stderr
    TIMINGS["start_to_added_s"] = time.monotonic() - started
    before = fleet.processed()[victim.url]
    with Load(fleet.port, clients=3, max_tokens=8, tag="added") as load:
        wait_for(
            "a request routed to the added replica",
            lambda: fleet.processed()[victim.url] > before,
            60,
        )
    assert all(o.ok for o in load.outcomes), [o.seen() for o in load.outcomes if not o.ok]


# ---------------------------------------------------------------------------------------------
# 4. the killed replica back


def test_4_the_killed_replica_restarted_by_docker_rejoins(fleet: Fleet) -> None:
    """Docker's restart policy brings test 2's replica back (it restarted while test 3 ran);
    the router sees it healthy again and sends it requests."""
    needs("killed")
    victim = fleet.replicas[1]
    wait_for("the victim restarted by Docker",
             lambda: docker_time(victim.project.state(REPLICA)["StartedAt"])
             > docker_time(str(KILLED["first_start"])), 60)  # fmt: skip
    killed_at = float(KILLED["at"])  # type: ignore[arg-type]
    assert victim.project.exit_codes(REPLICA, killed_at - 1) == [137]
    wait_answering([victim], START_GUARD_S)
    wait_router_ready(fleet, [r.url for r in fleet.replicas])
    TIMINGS["kill_to_back_in_rotation_s"] = time.time() - killed_at
    before = fleet.processed()[victim.url]
    with Load(fleet.port, clients=3, max_tokens=8, tag="rejoin") as load:
        wait_for("a request routed to the victim again",
                 lambda: fleet.processed()[victim.url] > before, 60)  # fmt: skip
    assert all(o.ok for o in load.outcomes), [o.seen() for o in load.outcomes if not o.ok]
    assert metric_sum(victim.metrics(), "vllm:request_success_total") >= 1


# ---------------------------------------------------------------------------------------------
# 5. another setting


def test_5_a_replica_with_another_setting_is_refused_by_doctor_and_the_router(
    fleet: Fleet,
) -> None:
    needs("fleet")
    fleet.odd_started.join(START_GUARD_S)
    assert not ODD_START_ERRORS, ODD_START_ERRORS
    wait_answering([fleet.odd], START_GUARD_S)
    good = [r.url for r in fleet.replicas]
    alike = fleet.admin("doctor", "--fleet", *good, "--json")
    assert alike.returncode == 0, alike.stdout + alike.stderr
    odd = fleet.admin("doctor", "--fleet", *good, fleet.odd.url, "--json")
    assert odd.returncode == 1, odd.stdout + odd.stderr
    rows = {row["name"]: row for row in json.loads(odd.stdout)}
    FIGURES["doctor_odd"] = rows[fleet.odd.url]
    assert rows[fleet.odd.url]["status"] == "blocker", rows
    detail = rows[fleet.odd.url]["detail"]
    assert "max_model_len" in detail and str(ODD_MAX_MODEL_LEN) in detail, detail
    assert all(rows[url]["status"] == "ok" for url in good), rows

    # What the router does with it: vllm-router 0.1.17 checks /health only, so it takes it in;
    # the router's fleet watch takes it out at its next check (ROUTER_FLEET_CHECK_S).
    before = fleet.processed()[fleet.odd.url]
    added = fleet.admin("router", "add", fleet.odd.url)
    assert added.returncode == 0, added.stdout + added.stderr

    def rotation() -> list[str]:
        done = fleet.admin("router", "workers")
        assert done.returncode == 0, done.stdout + done.stderr
        return [worker["url"] for worker in json.loads(done.stdout)]

    wait_for("the odd replica out of rotation", lambda: fleet.odd.url not in rotation(), 90, 1)
    status, text = get(fleet.port, "/health", key=None)
    assert status == 200, text
    refused = {entry["worker"]: entry for entry in json.loads(text)["refused"]}
    FIGURES["router_odd"] = refused.get(fleet.odd.url)
    assert list(refused) == [fleet.odd.url], refused
    assert {"field": "max_model_len", "here": str(ODD_MAX_MODEL_LEN),
            "fleet": str(MAX_MODEL_LEN)} in refused[fleet.odd.url]["differences"]  # fmt: skip
    with Load(fleet.port, clients=4, max_tokens=8, tag="odd") as load:
        wait_for("requests served", lambda: sum(o.ok for o in load.outcomes) >= 8, 60)
    assert all(o.ok for o in load.outcomes), [o.seen() for o in load.outcomes if not o.ok]
    assert fleet.processed()[fleet.odd.url] == before, "the odd replica was sent a request"
