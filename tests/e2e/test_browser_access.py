"""A real browser against a running server (serve.sh on the CPU, no API_KEY: what DNS rebinding
and cross-origin pages aim at), headless Chromium from Debian (support/browser.py):

- a page whose name resolves to 127.0.0.1 (a rebound name) opens the API as its own origin: it
  gets HTTP 421 (sparkserve.in_vllm.access), not the model list, and so do its own scripts;
- a page of another origin cannot read the API or send it JSON (vLLM's CORS list is empty);
- a name in ALLOWED_HOSTS and a page in ALLOWED_ORIGINS do reach it; curl and the openai client
  on 127.0.0.1 work as before;
- with the check off (ALLOWED_HOSTS=*) the rebinding case reads the model list: the browser
  test fails there, so it can fail.
"""

from __future__ import annotations

import http.server
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from support.browser import Browser, browser, missing
from support.cpu_launch import MODEL_NAME, launcher_server
from support.vllm_server import LOOPBACK, VllmServer

REBOUND = "rebound.test"  # the attacker's name, rebound to 127.0.0.1
ATTACKER_PAGE = "attacker.test"  # a page of another origin
ALLOWED_HOST = "allowed.test"  # in ALLOWED_HOSTS
ALLOWED_PAGE = "allowed-page.test"  # its origin in ALLOWED_ORIGINS
NAMES = (REBOUND, ATTACKER_PAGE, ALLOWED_HOST, ALLOWED_PAGE)
# A page's script: GET /v1/models and a JSON POST /v1/completions to `base` ("" is the page's own
# origin); each answer as "STATUS BODY", or "error ..." when the browser refused it to the page.
FETCH_BOTH = """
const [base, model, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const post = {method: "POST", headers: {"Content-Type": "application/json"},
              body: JSON.stringify({model: model, prompt: "Hello", max_tokens: 2})};
const shown = (reply) => reply.then(async (r) => `${r.status} ${await r.text()}`,
                                    (error) => `error ${error}`);
Promise.all([shown(fetch(base + "/v1/models")),
             shown(fetch(base + "/v1/completions", post))]).then(done);
"""
MODEL_LIST = f'"id":"{MODEL_NAME}"'


def flat(text: str) -> str:
    """The text without white space: JSON as the server wrote it, however the page shows it."""
    return re.sub(r"\s", "", text)


class Page(http.server.BaseHTTPRequestHandler):
    """An empty HTML page, whatever the name it is reached by: the origin is the test's."""

    def do_GET(self) -> None:
        body = b"<!doctype html><html><body>a page</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def pages() -> Iterator[int]:
    """The port of the test's page server (the other origins)."""
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    why = missing()
    assert why is None, f"{why}: run the tests through ./scripts/test.sh, which installs them"
    with browser(NAMES) as session:
        yield session


def start(work: Path, models: dict[str, str], site: Path, knobs: dict[str, str]) -> VllmServer:
    """serve.sh without API_KEY (the subject is the browser, not decoding: no drafter)."""
    return launcher_server(work, "dflash", models, site, {"NUM_SPEC_TOKENS": "0", **knobs})


@pytest.fixture(scope="module")
def server(
    tiny_models: dict[str, str],
    sparkserve_site: Path,
    tmp_path_factory: pytest.TempPathFactory,
    pages: int,
) -> Iterator[VllmServer]:
    knobs = {
        "ALLOWED_HOSTS": ALLOWED_HOST,
        "ALLOWED_ORIGINS": f"http://{ALLOWED_PAGE}:{pages}",
    }
    work = tmp_path_factory.mktemp("browser-server")
    with start(work, tiny_models, sparkserve_site, knobs) as running:
        running.wait_healthy()
        yield running


def rebound_reads(chromium: Browser, port: int) -> tuple[str, list[str]]:
    """What a rebound page gets: the API opened as its own origin, and its own script's GET and
    JSON POST."""
    shown = chromium.open(f"http://{REBOUND}:{port}/v1/models")
    return shown, chromium.async_script(FETCH_BOTH, "", MODEL_NAME)


def assert_rebinding_refused(chromium: Browser, port: int) -> None:
    shown, (listed, completed) = rebound_reads(chromium, port)
    assert MODEL_LIST not in flat(shown) and "ALLOWED_HOSTS" in shown, shown
    assert listed.startswith("421 ") and MODEL_LIST not in flat(listed), listed
    assert completed.startswith("421 ") and '"choices"' not in completed, completed


def test_a_rebound_name_gets_421_not_the_model_list(chromium: Browser, server: VllmServer) -> None:
    assert_rebinding_refused(chromium, server.port)


def test_a_page_of_another_origin_can_neither_read_nor_post(
    chromium: Browser, server: VllmServer, pages: int
) -> None:
    """The GET goes out (no preflight) but its answer is kept from the page; the JSON POST needs
    a preflight, which vLLM's CORS middleware refuses, so it is never sent."""
    before = completions(server)
    chromium.open(f"http://{ATTACKER_PAGE}:{pages}/")
    answers = chromium.async_script(FETCH_BOTH, f"http://{LOOPBACK}:{server.port}", MODEL_NAME)
    assert answers == ["error TypeError: Failed to fetch"] * 2, answers
    assert completions(server) == before, "the POST reached vLLM"


def test_an_allowed_name_and_an_allowed_page_reach_the_api(
    chromium: Browser, server: VllmServer, pages: int
) -> None:
    assert MODEL_LIST in flat(chromium.open(f"http://{ALLOWED_HOST}:{server.port}/v1/models"))
    chromium.open(f"http://{ALLOWED_PAGE}:{pages}/")
    listed, completed = chromium.async_script(
        FETCH_BOTH, f"http://{LOOPBACK}:{server.port}", MODEL_NAME
    )
    assert listed.startswith("200 ") and MODEL_LIST in flat(listed), listed
    assert completed.startswith("200 ") and '"choices"' in completed, completed


def test_curl_and_the_openai_client_on_loopback_work_as_before(server: VllmServer) -> None:
    url = f"http://{LOOPBACK}:{server.port}/v1/models"
    done = subprocess.run(["curl", "-sS", url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and MODEL_LIST in flat(done.stdout), done
    rebound = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-H", f"Host: {REBOUND}", url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert rebound.stdout == "421", rebound
    for base in (f"http://{LOOPBACK}:{server.port}/v1", f"http://localhost:{server.port}/v1"):
        client = openai.OpenAI(base_url=base, api_key="unused", timeout=120)
        assert [model.id for model in client.models.list()] == [MODEL_NAME]
        reply = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=2)
        assert reply.choices and reply.usage is not None and reply.usage.completion_tokens > 0


def test_with_the_check_off_the_rebinding_test_fails(
    chromium: Browser,
    tiny_models: dict[str, str],
    sparkserve_site: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """ALLOWED_HOSTS=*: the rebound page reads the model list and completes text, so the
    assertion above fails: it tests the check, not the browser set-up."""
    work = tmp_path_factory.mktemp("browser-unchecked")
    with start(work, tiny_models, sparkserve_site, {"ALLOWED_HOSTS": "*"}) as unchecked:
        unchecked.wait_healthy()
        with pytest.raises(AssertionError):
            assert_rebinding_refused(chromium, unchecked.port)
        shown, (listed, completed) = rebound_reads(chromium, unchecked.port)
        assert MODEL_LIST in flat(shown) and listed.startswith("200 "), shown
        assert completed.startswith("200 ") and '"choices"' in completed, completed


def completions(server: VllmServer) -> float:
    """Completion requests vLLM has finished so far (its own counter)."""
    total = 0.0
    for (name, _), value in server.metrics().items():
        if name == "vllm:request_success_total":
            total += value
    return total
