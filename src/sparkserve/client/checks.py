"""What the selftest asks of one running server, check by check.

Each check is a function of a `Probe` (the server, its key, what the case serves) that returns
a `Result` of three outcomes: passed (ok), FAILED, or not tested (`ok` None) with the reason in
its detail: random weights that cannot judge a divergence, a GPU-only feature on a CPU, a
feature that did not run. A not-tested result that the settings claim (`claimed`: the int8
head on, speculation on, prefix caching on) keeps the run from passing: `exit_status`. A check
never raises: an exception is its failure, in one line.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkserve import command_line as cl
from sparkserve.client import metrics
from sparkserve.client.server import Server, ServerError
from sparkserve.in_vllm import access

PARITY_PROMPTS = ("The cache keeps", "def count(items):\n", "Spark serving: ")
PARITY_TOKENS = 24
# A divergence is a failure only when the reference's choice was clear: its top token led the
# runner-up by more than this (natural log). On random weights margins are tiny.
CLEAR_MARGIN = 1.0
PREFIX_BLOCKS = (1, 2, 4)
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
TOOL = {
    "type": "function",
    "function": {
        "name": "set_unit",
        "description": "Choose the temperature unit.",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"type": "string", "enum": ["celsius", "kelvin"]}},
            "required": ["unit"],
            "additionalProperties": False,
        },
    },
}


# the reasons a claimed feature is not tested, in the words the table and the JSON use
NO_INT8_HEAD = "no int8 head ran"
NO_DRAFT = "no draft was proposed"
RANDOM_WEIGHTS = "random weights: a divergence cannot be judged"
NOT_TESTED = "not tested"


def mark(ok: bool | None) -> str:
    """A check's outcome in a word: ok (passed), FAILED, or not tested."""
    return {True: "ok", False: "FAILED", None: NOT_TESTED}[ok]


@dataclass
class Result:
    name: str
    ok: bool | None  # None: not tested (the detail says why)
    detail: str
    data: dict[str, Any] = field(default_factory=dict)
    # the settings claim what this checks (int8 head, speculation, prefix caching): not
    # tested is then not a pass (EXIT_NOT_TESTED)
    claimed: bool = False


def not_tested(name: str, reason: str, detail: str = "", claimed: bool = False,
               data: dict[str, Any] | None = None) -> Result:  # fmt: skip
    """A result that judged nothing: `reason` first, in the table's words."""
    return Result(name, None, f"{NOT_TESTED}: {reason}" + (f"; {detail}" if detail else ""),
                  data or {}, claimed)  # fmt: skip


def as_json(result: Result) -> dict[str, Any]:
    """A result for the JSON reports, its outcome in words beside `ok`."""
    return {**asdict(result), "outcome": "passed" if result.ok else mark(result.ok)}


def untested_claims(names_results: Iterable[tuple[str, Result]]) -> list[str]:
    """`where: check` for each claimed check that was not tested."""
    return [f"{where}: {r.name}" if where else r.name
            for where, r in names_results if r.ok is None and r.claimed]  # fmt: skip


def exit_status(results: Iterable[Result]) -> int:
    """EXIT_FAILED where a check failed; else EXIT_NOT_TESTED where a claimed check was not
    tested; else EXIT_OK."""
    found = list(results)
    if any(r.ok is False for r in found):
        return cl.EXIT_FAILED
    if any(r.ok is None and r.claimed for r in found):
        return cl.EXIT_NOT_TESTED
    return cl.EXIT_OK


@dataclass
class Probe:
    server: Server
    key: str
    model: str
    speculative: bool  # the case drafts tokens
    head_report_dir: Path
    int8_head: bool  # the case leaves the int8 head on
    cuda: bool  # the server runs on a CUDA GPU (where the int8 head must win)
    # blocks of a cached prefix vLLM recomputes: an EAGLE-style drafter (MTP) needs the target's
    # hidden states of the last matched block, so vLLM drops it from each hit; DFlash does not
    # (vLLM issue #51250; sparkserve.launch.workarounds turns the drop off before 0.33)
    kept_back: int = 0
    # the tool-call format the model writes, named by the parser its recipe gives (the model's
    # truth), and the parser the server runs (TOOL_PARSER): `check_tool_call`
    tool_format: str = ""
    tool_parser: str = ""
    metrics_open: bool = False  # METRICS_OPEN=1: /metrics needs no key
    server_log: Path | None = None  # what vLLM printed: where its KV cache groups are named

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 300) -> Any:
        return self.server.request(path, {"model": self.model, **body}, timeout_s=timeout_s)


def reply_of(
    probe: Probe, method: str, path: str, key: str | None, body: dict | None = None
) -> tuple[int, Any]:
    """The HTTP status and body (JSON where it parses, else text) of one request sent with
    `key` (None: no Authorization header); the body's model defaults to the probe's."""
    connection = http.client.HTTPConnection(probe.server.host, probe.server.port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    try:
        data = json.dumps({"model": probe.model, **body}) if body is not None else None
        connection.request(method, path, data if method != "GET" else None, headers)
        response = connection.getresponse()
        raw = response.read().decode(errors="replace")
    finally:
        connection.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw


def status_of(
    probe: Probe, method: str, path: str, key: str | None, body: dict | None = None
) -> int:
    """The HTTP status of one request sent with `key` (None: no Authorization header)."""
    return reply_of(probe, method, path, key, body)[0]


def check_key(probe: Probe) -> Result:
    """Every route of the server's OpenAPI document (and the document's own pages), asked
    without the key, gets 401 but the open ones (sparkserve.in_vllm.access); a wrong key gets 401;
    the key gets a completion."""
    document = probe.server.request("/openapi.json")
    routes = {
        (method.upper(), re.sub(r"\{[^}]*\}", "x", path))  # any value: 401 comes first
        for path, operations in document["paths"].items()
        for method in operations
        if method.upper() in HTTP_METHODS
    } | {("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc")}
    open_paths = access.open_paths(probe.metrics_open)
    wrong = []
    for method, path in sorted(routes):
        status = status_of(probe, method, path, None)
        if (status == 401) == (path in open_paths):
            wrong.append(f"{method} {path} {status}")
    body = {"prompt": "hi", "max_tokens": 1}
    wrong_key = status_of(probe, "POST", "/v1/completions", probe.key + "x", body)
    right_key = status_of(probe, "POST", "/v1/completions", probe.key, body)
    ok = not wrong and wrong_key == 401 and right_key == 200
    detail = (f"{len(routes)} routes: 401 without the key but {', '.join(sorted(open_paths))}; "
              f"a wrong key {wrong_key}, the key {right_key}")  # fmt: skip
    if wrong:
        detail = f"not as expected: {'; '.join(wrong)}; " + detail
    return Result("key", ok, detail, {"routes": len(routes), "wrong": wrong})


def check_completion(probe: Probe) -> Result:
    reply = probe.post("/v1/completions", {"prompt": "Hello", "max_tokens": 16,
                                           "temperature": 0, "ignore_eos": True})  # fmt: skip
    tokens = reply["usage"]["completion_tokens"]
    return Result("completion", tokens == 16, f"{tokens} of 16 tokens")


def check_chat(probe: Probe) -> Result:
    reply = probe.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hello, how is the cache?"}],
        "max_tokens": 16, "temperature": 0, "ignore_eos": True})  # fmt: skip
    message = reply["choices"][0]["message"]
    tokens = reply["usage"]["completion_tokens"]
    ok = message.get("role") == "assistant" and tokens == 16
    return Result("chat", ok, f"role {message.get('role')}, {tokens} of 16 tokens")


def check_stream(probe: Probe) -> Result:
    stream = probe.server.stream_completion(probe.model, "Once", 64)
    rate = stream.decode_tok_s
    ok = stream.error is None and stream.finish_reason == "length"
    ok = ok and stream.completion_tokens == 64
    detail = f"{stream.completion_tokens} of 64 tokens, finish {stream.finish_reason}"
    if rate:
        detail += f", {rate:.0f} tok/s"
    if stream.error:
        detail += f", error: {stream.error}"
    return Result("stream", ok, detail, {"decode_tok_s": rate, "ttft_s": stream.ttft_s})


# One call of TOOL as each model family writes it, keyed by the parser its recipe names:
# Qwen3.5 and Qwen3-Coder write XML (qwen3_xml, qwen3_coder), Qwen3 Hermes-style JSON
CALL_ARGUMENTS = {"unit": "kelvin"}
XML_CALL = ("<tool_call>\n<function=set_unit>\n<parameter=unit>\nkelvin\n</parameter>\n"
            "</function>\n</tool_call>")  # fmt: skip
HERMES_CALL = '<tool_call>\n{"name": "set_unit", "arguments": {"unit": "kelvin"}}\n</tool_call>'
CALL_TEXT = {"qwen3_xml": XML_CALL, "qwen3_coder": XML_CALL, "hermes": HERMES_CALL}
REGEX_META = set("\\.^$|?*+()[]{}")


def arguments_fault(arguments: str) -> str | None:
    """What is wrong with a call's arguments against TOOL's schema (an object with `unit`, one
    of its enum, nothing else), or None where they fit it."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return "not JSON"
    schema = TOOL["function"]["parameters"]
    if not isinstance(value, dict):
        return "not an object"
    missing = [name for name in schema["required"] if name not in value]
    extra = sorted(set(value) - set(schema["properties"]))
    if missing or extra:
        return f"missing {missing}" if missing else f"not in the schema: {extra}"
    allowed = schema["properties"]["unit"]["enum"]
    return None if value["unit"] in allowed else f"unit {value['unit']!r} is not one of {allowed}"


def judge_tool_reply(reply: dict[str, Any], max_tokens: int) -> Result:
    """The outcome of a `tool_choice: "required"` reply (`check_tool_arguments`). vLLM holds
    the reply to the tools with a grammar made by its tool parser, and the parser makes the
    calls of the reply: a reply that ended (not cut at max_tokens) with no call, or a call of
    another function, fails. Arguments that fit the schema pass; ones that do not are not
    tested, since random weights write them where the parser's grammar holds the call's tags
    and not its parameters (qwen3_xml), or whitespace where a JSON grammar allows it; a reply
    cut at max_tokens is not tested."""
    choice = reply["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    cut = choice.get("finish_reason") == "length"
    if not calls:
        said = str(choice["message"].get("content"))[:80]
        if cut:
            why = f"random weights: the call did not end within {max_tokens} tokens"
            return not_tested("tool arguments", why, f"content {said!r}")
        return Result("tool arguments", False, f"the tool parser found no call in the reply "
                      f"({choice.get('finish_reason')}): content {said!r}")  # fmt: skip
    function = calls[0]["function"]
    shown = f"{function['name']}({function['arguments'][:80]})"
    if function["name"] != TOOL["function"]["name"]:
        return Result("tool arguments", False, f"{shown}: a function the request did not offer")
    fault = arguments_fault(function["arguments"])
    if fault is None:
        return Result("tool arguments", True, f"{shown}: the parser's call, its arguments fit "
                      "the schema", {"arguments": function["arguments"]})  # fmt: skip
    why = "random weights: the arguments are not held by a grammar" + (
        f" and were cut at {max_tokens} tokens" if cut else "")  # fmt: skip
    return not_tested("tool arguments", why, f"{shown}: {fault}", data={"fault": fault})


def check_tool_arguments(probe: Probe) -> Result:
    """`tool_choice: "required"`: the server holds the reply to a call of the offered function
    with a grammar its tool parser makes, and its parser finds the call (a named choice would
    not do: for a parser without a grammar of its own vLLM copies the name from the request).
    Judged by `judge_tool_reply`. Thinking off: the constraint starts where the reasoning
    ends."""
    max_tokens = 128
    reply = probe.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Use kelvin."}], "tools": [TOOL],
        "tool_choice": "required", "max_tokens": max_tokens, "temperature": 0,
        **NO_THINKING})  # fmt: skip
    return judge_tool_reply(reply, max_tokens)


def check_tool_call(probe: Probe) -> Result:
    """The server's tool parser reads a call written in the model's own format. The model is
    made to write one exact call (`CALL_TEXT` for its format, held by a regex grammar under
    `tool_choice: "auto"`, whatever its weights), and the parser must return it as
    set_unit({"unit": "kelvin"}). A TOOL_PARSER that does not read the model's format finds no
    call in it: FAILED."""
    text = CALL_TEXT.get(probe.tool_format)
    if text is None:
        return not_tested("tool call", f"no call text for the model's format "
                          f"{probe.tool_format or '(none)'!r}")  # fmt: skip
    reply = probe.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Use kelvin."}], "tools": [TOOL],
        "tool_choice": "auto", "structured_outputs": {"regex": literal_regex(text)},
        "max_tokens": 128, "temperature": 0, **NO_THINKING})  # fmt: skip
    where = f"TOOL_PARSER={probe.tool_parser or '?'} on the model's {probe.tool_format} format"
    return judge_parsed_call(reply, where)


def judge_parsed_call(reply: dict[str, Any], where: str) -> Result:
    """`check_tool_call`'s verdict: the parser returned exactly the call the model wrote."""
    choice = reply["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    read = [(c["function"]["name"], _json_or_text(c["function"]["arguments"])) for c in calls]
    wanted = [(TOOL["function"]["name"], CALL_ARGUMENTS)]
    if read == wanted:
        return Result("tool call", True, f"{where}: read set_unit({json.dumps(CALL_ARGUMENTS)})")
    said = str(choice["message"].get("content"))[:80]
    return Result("tool call", False, f"{where}: the parser read {read or 'no call'} "
                  f"(finish {choice.get('finish_reason')}), content {said!r}")  # fmt: skip


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def literal_regex(text: str) -> str:
    """A regex that matches `text` only (xgrammar's dialect: metacharacters escaped, newlines
    as \\n)."""
    return "".join("\\n" if c == "\n" else f"\\{c}" if c in REGEX_META else c for c in text)


def check_reasoning(probe: Probe) -> Result:
    """The reasoning parser splits a chat reply where the thinking ends. Random weights never
    write `</think>`, so the split is shown by where the prompt leaves it: thinking on (the
    prompt ends inside `<think>`), the whole reply is reasoning; thinking off (the prompt
    closes it), the whole reply is content."""
    seen = {}
    for thinking in (True, False):
        reply = probe.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Think first."}], "max_tokens": 16,
            "temperature": 0, "ignore_eos": True,
            "chat_template_kwargs": {"enable_thinking": thinking}})  # fmt: skip
        message = reply["choices"][0]["message"]
        reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
        seen[thinking] = (len(reasoning), len(message.get("content") or ""))
    (on_reasoning, on_content), (off_reasoning, off_content) = seen[True], seen[False]
    ok = on_reasoning > 0 and on_content == 0 and off_reasoning == 0 and off_content > 0
    detail = "thinking on: reasoning {} chars, content {}; off: reasoning {}, content {}"
    return Result("reasoning", ok, detail.format(*seen[True], *seen[False]))


def check_speculation(probe: Probe) -> Result:
    snapshot = probe.server.settled_metrics()
    drafts = metrics.total(snapshot, metrics.DRAFTS)
    drafted = metrics.total(snapshot, metrics.DRAFT_TOKENS)
    accepted = metrics.total(snapshot, metrics.ACCEPTED)
    if not probe.speculative:
        ok = drafts == 0
        return Result("speculation", ok, f"off: {drafts:.0f} drafts")
    rate = accepted / drafted if drafted else 0.0
    detail = f"{drafts:.0f} drafts, {drafted:.0f} tokens drafted, {accepted:.0f} accepted"
    detail += f" ({rate:.0%}; random weights: acceptance means nothing)"
    data = {"drafts": drafts, "drafted": drafted, "accepted": accepted}
    if not drafts or not drafted:  # the case speculates: a drafter that never proposed
        return not_tested("speculation", NO_DRAFT, detail, claimed=True, data=data)
    return Result("speculation", True, detail, data, claimed=True)


def cache_info(snapshot: metrics.Snapshot) -> dict[str, str]:
    """vllm:cache_config_info's labels: vLLM's cache config, every field a string."""
    for (name, pairs), _ in snapshot.items():
        if name == metrics.CACHE_INFO:
            return dict(pairs)
    return {}


def block_size(info: dict[str, str]) -> int | None:
    try:
        return int(float(info["block_size"]))
    except (KeyError, ValueError):
        return None


# vLLM's own lines (v1/core/kv_cache_utils.py) for a model of several KV cache groups: each
# group's block, and their least common multiple, the scheduler's block
GROUP_BLOCKS = re.compile(r"kv cache group sizes \(([\d, ]+)\)")
HIT_UNIT = re.compile(r"kv lcm block sizes (\d+)")
# vLLM's line for a hybrid target in align mode (platforms/interface.py
# `_align_hybrid_block_size`): the attention block that holds a GatedDeltaNet state, which is
# the Mamba groups' block
MAMBA_BLOCK = re.compile(r"Setting attention block size to (\d+) tokens")


def hit_unit(log: str, block: int) -> tuple[int, str]:
    """The tokens a prefix hit comes in, with why in words where it is not `block`
    (vllm:cache_config_info's; on a hybrid target the align-mode Mamba block). vLLM hashes
    prompts in the groups' greatest common divisor and, where a Mamba block is larger than
    that, lets hits land on it (`partial_hash_hits_enabled`: the hybrid-page-divide patch's
    layout, groups of 2240 and 1120); otherwise hits land on the least common multiple of the
    groups' blocks where vLLM logged one above `block` (a DFlash drafter's on the stock Spark
    geometry, groups of 2240 and 4480: docs/SELFTEST.md)."""
    groups = GROUP_BLOCKS.search(log)
    sizes = sorted({int(size) for size in groups.group(1).split(",")}) if groups else []
    named = " and ".join(str(size) for size in sizes) or "?"
    mamba = MAMBA_BLOCK.search(log)
    # vLLM's condition (kv_cache_utils `partial_hash_hits_enabled`): a Mamba block above the
    # hash block; vllm:cache_config_info may give either block, so the log decides
    if sizes and mamba and int(mamba.group(1)) > math.gcd(*sizes):
        fine = math.gcd(*sizes)
        return fine, (
            f"hits land on {fine}-token boundaries (the greatest common divisor of the KV "
            f"cache groups' blocks, {named}, below the {mamba.group(1)}-token GatedDeltaNet "
            f"block: vLLM's sub-block hits)"
        )
    if sizes and block in sizes and math.gcd(*sizes) < block:
        fine = math.gcd(*sizes)
        return fine, (
            f"hits land on {fine}-token boundaries (the greatest common divisor of the KV "
            f"cache groups' blocks, {named}: vLLM's sub-block hits)"
        )
    unit = HIT_UNIT.search(log)
    if not unit or int(unit.group(1)) <= block:
        return block, ""
    return int(unit.group(1)), (
        f"hits land on {unit.group(1)}-token boundaries (the least common multiple of the KV "
        f"cache groups' blocks, {named})"
    )


def check_prefix_hits(probe: Probe, max_len: int) -> Result:
    """Prompts of 1, 2 and 4 whole cache blocks plus a quarter block, each sent twice: the
    second must hit every whole hit unit (`hit_unit`; the tokenizer makes one token per byte),
    but for the units the case's drafter keeps back (`Probe.kept_back`)."""
    info = cache_info(probe.server.metrics())
    block = block_size(info)
    if not block:
        return Result("prefix hits", False, "no block_size in vllm:cache_config_info")
    if info.get("enable_prefix_caching") != "True":
        return Result("prefix hits", False, "prefix caching is off (vllm:cache_config_info)")
    log = probe.server_log.read_text(errors="replace") if probe.server_log else ""
    unit, why = hit_unit(log, block)
    if unit > PREFIX_BLOCKS[-1] * block:
        return Result("prefix hits", False, f"{why}: no prompt sent here can hit")
    rows, ok = [], True
    for blocks in PREFIX_BLOCKS:
        length = blocks * block + block // 4
        if length + 2 > max_len:
            rows.append(f"{blocks} blocks: longer than MAX_MODEL_LEN {max_len}, not sent")
            continue
        letters = random.Random(blocks).choices("abcdefghijklmnopqrstuvwxyz ", k=length)
        body = {"prompt": "".join(letters), "max_tokens": 1, "temperature": 0}
        probe.post("/v1/completions", body)
        before = probe.server.settled_metrics()
        reply = probe.post("/v1/completions", body)
        after = probe.server.settled_metrics()
        hits = metrics.delta(before, after, metrics.PREFIX_HITS) or 0
        prompt = reply["usage"]["prompt_tokens"]
        ok = ok and hits >= max(0, blocks * block // unit - probe.kept_back) * unit
        rows.append(f"{blocks} x {block}: {hits:.0f} of {prompt} hit")
    if why:
        rows.append(why)
    if probe.kept_back:
        rows.append(f"{probe.kept_back} block kept back for the MTP drafter (vLLM's design)")
    return Result("prefix hits", ok, "; ".join(rows), {"block": block, "unit": unit})


def check_head(probe: Probe) -> Result:
    """The int8 lm-head's report (SPARKSERVE_LMHEAD_REPORT): its path, kernel, what it freed
    and whether the drafter shares it. The bf16 case must keep the bf16 head; the others use
    the int8 one, except where the plugin's calibration found bf16 faster off CUDA."""
    files = sorted(probe.head_report_dir.glob("lmhead-*.json"))
    if not files:
        return Result("lm head", False, "no report from the int8 lm-head plugin")
    report = json.loads(files[-1].read_text())
    if report["path"] != "int8":
        if not probe.int8_head:
            return Result("lm head", True, f"bf16: {report['reason']}", report)
        if probe.cuda:  # on CUDA the int8 head must win
            return Result("lm head", False, f"bf16: {report['reason']}", report, claimed=True)
        detail = f"bf16: {report['reason']} (off CUDA)"
        return not_tested("lm head", NO_INT8_HEAD, detail, claimed=True, data=report)
    net = report["freed_bytes"] - report["int8_bytes"]
    shared = report["drafter"] == "shares the target's head (int8)"
    ok = probe.int8_head and report["freed_bytes"] > 0 and (shared or not probe.speculative)
    detail = f"int8 ({report['kernel']} kernel), net {net / 2**20:.1f} MiB back, drafter: "
    return Result("lm head", ok, detail + report["drafter"], report, claimed=probe.int8_head)


def greedy_tokens(probe: Probe) -> Result:
    """Greedy completions of the parity prompts with the top two logprobs of each token; the
    run compares them across cases (`compare_greedy`)."""
    runs = []
    for prompt in PARITY_PROMPTS:
        reply = probe.post("/v1/completions", {
            "prompt": prompt, "max_tokens": PARITY_TOKENS, "temperature": 0, "logprobs": 2,
            "ignore_eos": True})  # fmt: skip
        logprobs = reply["choices"][0]["logprobs"]
        runs.append({"tokens": logprobs["tokens"], "top": logprobs["top_logprobs"]})
    return Result("greedy", True, f"{len(runs)} prompts x {PARITY_TOKENS} tokens", {"runs": runs})


def compare_greedy(name: str, runs: list[dict], reference: list[dict]) -> Result:
    """The first token where `runs` leaves the reference's greedy path, and how clear the
    reference's choice was there (its top logprob minus the runner-up's). Identical paths
    pass; a divergence where the choice was clear fails; one where it was not (random
    weights' tiny margins) is not tested, and the case claims it (speculation, the int8
    head), so it keeps the selftest from passing."""
    notes, diverged, clear = [], False, False
    for index, (run, ref) in enumerate(zip(runs, reference, strict=True)):
        at = next(
            (i for i, (a, b) in enumerate(zip(run["tokens"], ref["tokens"], strict=False))
             if a != b), None)  # fmt: skip
        if at is None:
            notes.append(f"prompt {index + 1}: identical")
            continue
        top = sorted((ref["top"][at] or {}).values(), reverse=True)
        margin = top[0] - top[1] if len(top) > 1 else float("inf")
        diverged, clear = True, clear or margin > CLEAR_MARGIN
        notes.append(f"prompt {index + 1}: token {at}, margin {margin:.3f}")
    if diverged and not clear:
        return not_tested(name, RANDOM_WEIGHTS, "; ".join(notes), claimed=True)
    return Result(name, not diverged, "; ".join(notes), claimed=True)


def run_checks(
    probe: Probe, steps: list[tuple[str, Callable[[], Result]]], progress: Callable[[str], None]
) -> list[Result]:
    results = []
    for name, step in steps:
        started = time.monotonic()
        try:
            result = step()
        except (ServerError, KeyError, IndexError, TypeError, ValueError, OSError) as error:
            result = Result(name, False, f"{type(error).__name__}: {error}"[:300])
        progress(f"{name}: {mark(result.ok)} ({time.monotonic() - started:.1f} s) {result.detail}")
        results.append(result)
    return results
