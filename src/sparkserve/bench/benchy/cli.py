"""`sparkserve llama-benchy`: llama-benchy (PyPI `llama-benchy`, pinned in the image: the
benchmark Spark owners post) run against the server with a profile: `arena-v2` (Spark
Arena's v2: pp 2048, tg 128, depth 0 to 100k, concurrency 1/2/5/10, prefix caching on) or
`short`. What the server's /metrics counted over each of its tests (acceptance length and
acceptance per draft position, prefix-cache hits, peak KV cache usage) is joined to its rows.

The result (llama-benchy.json, benchy.json, benchy.md, benchy.png) names the image, vLLM's
release, the knobs, the profile and the corpus, so that two users can compare. The corpus is
llama-benchy's default book (downloaded once), or `--corpus offline`: sparkserve's own text,
nothing downloaded. /metrics is server-wide: bench a server nobody else is using. Exit
status: 0 done, 2 bad input or a server not usable (nothing was sent), 3 llama-benchy failed,
130 interrupted; in the last two cases what was measured is still written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkserve import __version__
from sparkserve import command_line as cl
from sparkserve.bench.benchy import corpus, keyed, report
from sparkserve.bench.benchy.profiles import PROFILES, Profile, parse_depths, profile_named
from sparkserve.bench.benchy.run import Run, run_llama_benchy
from sparkserve.client import tool
from sparkserve.client.bank import parse_bank
from sparkserve.client.server import Server, ServerError
from sparkserve.client.tool import RunAborted, UsageError, say
from sparkserve.knobs.registry import BY_NAME
from sparkserve.launch.settings import Settings, tool_settings
from sparkserve.output.atomic_file import replace_text

DIST = "llama-benchy"
# the chat template's tokens around a prompt: llama-benchy measures and subtracts them
TEMPLATE_MARGIN = 64


def own_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile", default="arena-v2",
        help="; ".join(f"{p.name}: {p.why}" for p in PROFILES.values()) + " (default arena-v2)",
    )  # fmt: skip
    parser.add_argument("--depths", help="context depths instead of the profile's, e.g. 0,4096")
    parser.add_argument(
        "--runs", type=cl.ranged(int, "--runs", 1), help="runs per test instead of the profile's"
    )
    parser.add_argument(
        "--corpus", choices=corpus.CORPORA, default="book",
        help="book: llama-benchy's default (Project Gutenberg's Sherlock Holmes, downloaded "
             "once; what Spark Arena's figures used); offline: sparkserve's own text, nothing "
             "downloaded (default book)",
    )  # fmt: skip
    parser.add_argument(
        "--tokenizer",
        help="the folder (or tokenizer.json) llama-benchy counts tokens with (default: the "
        "served model's, from its folder or the Hugging Face cache)",
    )


def installed_version() -> str:
    if importlib.util.find_spec("llama_benchy") is None:
        raise UsageError(
            f"{DIST} is not installed for {sys.executable}: run `scripts/bench.sh llama-benchy` "
            "against the server's container (its image has it), or install the version "
            "requirements/spark-aarch64.lock pins"
        )
    return importlib.metadata.version(DIST)


def tokenizer_of(server: Server, model: str, given: str | None) -> str:
    """--tokenizer, else the folder the server loaded (or its Hugging Face cache entry)."""
    if given:
        if not Path(given).exists():
            raise UsageError(f"bad --tokenizer {given!r}: no such file or folder")
        return given
    try:
        listing = server.request("/v1/models", timeout_s=10)
        root = str(next(e for e in listing["data"] if e["id"] == model).get("root") or model)
    except (ServerError, StopIteration, KeyError, TypeError) as exc:
        raise UsageError(f"no tokenizer: /v1/models did not say what {model} is ({exc})") from None
    if Path(root).is_dir():
        return root
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(root, "tokenizer.json")
    except ImportError:
        cached = None
    if isinstance(cached, str):
        return cached
    raise UsageError(
        f"no tokenizer for {model}: the server loaded {root!r}, which is neither a folder here "
        "nor in this Hugging Face cache; pass --tokenizer PATH"
    )


def chosen_profile(args: argparse.Namespace) -> Profile:
    profile = profile_named(args.profile)
    depths = parse_depths(args.depths) if args.depths is not None else None
    levels = tuple(parse_bank(args.concurrency, "--concurrency")) if args.concurrency else None
    return profile.with_overrides(depths, levels, args.runs)


def _knobs(settings: Settings) -> tuple[dict[str, str], str, str]:
    """The knobs the tool read (secrets left out), the image and the recipe."""
    shown = {k: v for k, v in settings.text.items() if not BY_NAME[k].secret}
    return shown, settings.image, settings.values.RECIPE


def _run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    profile = chosen_profile(args)
    version = installed_version()
    settings = tool_settings(env)
    server, info = tool.connect(args, settings)
    need = profile.tokens_needed() + TEMPLATE_MARGIN
    if info.max_model_len is not None and need > info.max_model_len:
        deepest = info.max_model_len - need + max(profile.depths)
        raise UsageError(
            f"bad depths for --profile {profile.name}: depth {max(profile.depths)} + pp "
            f"{profile.pp} + tg {profile.tg} needs {need} tokens; the server's max_model_len is "
            f"{info.max_model_len} (pass --depths up to {deepest})"
        )
    tokenizer = tokenizer_of(server, info.model, args.tokenizer)
    knobs, image, recipe = _knobs(settings)
    out = tool.output_folder(args.out, "llama-benchy")
    out.mkdir(parents=True, exist_ok=True)
    seats = tool.max_num_seqs(args, settings)
    if max(profile.concurrency) > seats:
        say(f"[llama-benchy] concurrency above MAX_NUM_SEQS {seats} waits in vLLM's queue")
    with tempfile.TemporaryDirectory(prefix="sparkserve-benchy-") as home:
        text = corpus.prepare(args.corpus, Path(home))
        child_env = dict(os.environ)
        if args.corpus == "offline":
            child_env["HOME"] = home  # where llama-benchy finds the seeded text
        options = [
            "--base-url", f"{server.url}{server.prefix}/v1", "--model", info.model,
            "--served-model-name", info.model, "--tokenizer", tokenizer,
            "--book-url", text.url, *profile.llama_benchy_options(),
            "--format", "json", "--save-result", str(out / "llama-benchy.json"),
        ]  # fmt: skip
        if server.api_key:  # through the environment: a command line is visible to all
            child_env[keyed.KEY_ENV] = server.api_key
        say(f"[llama-benchy] {DIST} {version}, profile {profile.name} against {server.url} "
            f"({info.model}); writing to {out}/")  # fmt: skip
        started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        run = Run()

        def work() -> None:
            run_llama_benchy(options, child_env, server, say, run)
            if run.returncode:
                raise RunAborted(f"{DIST} exited with status {run.returncode} (its output above)")

        outcome = tool.run_cut_short(work)
    saved = out / "llama-benchy.json"
    result = json.loads(saved.read_text()) if saved.is_file() else None
    tests = [w.summary(info.model) for w in run.windows]
    rows = report.join(result["benchmarks"], tests) if result else []
    document: dict[str, Any] = {
        "tool": "sparkserve llama-benchy", "version": __version__, "started_at": started,
        "status": outcome.label("DONE"), "error": outcome.error or run.metrics_error,
        "url": server.url, "model": info.model, "max_model_len": info.max_model_len,
        "image": image, "recipe": recipe, "vllm": server.vllm_version(), "knobs": knobs,
        "profile": {"name": profile.name, "pp": profile.pp, "tg": profile.tg,
                    "depths": list(profile.depths), "concurrency": list(profile.concurrency),
                    "runs": profile.runs, "exact_tg": profile.exact_tg,
                    "coherence": profile.coherence},
        "corpus": {"name": text.name, "url": text.url, "sha256": text.sha256},
        "llama_benchy": {"version": version, "argv": options, "result": result},
        "tests": tests,
        "rows": rows, "unmeasured": report.unmeasured(rows),
        "files": {"json": "benchy.json", "markdown": "benchy.md", "png": "benchy.png",
                  "llama_benchy": "llama-benchy.json"},
    }  # fmt: skip
    table = report.llama_benchy_table(document, out / "llama-benchy.md")
    text_md = report.markdown(document, table)
    replace_text(out / "benchy.md", text_md)
    tool.write_report(out, "benchy", document, report.plot, "llama-benchy")
    if document["error"]:
        say(f"[llama-benchy] {document['error']}")
    print(text_md, end="", flush=True)
    return outcome.exit_code(cl.EXIT_OK)


COMMAND = tool.LoadCommand(
    "llama-benchy", "llama-benchy's pp/tg tokens/s at context depths, joined with /metrics",
    ("--concurrency", "concurrency levels instead of the profile's, e.g. 1,2"),
    (), own_options, _run,
)  # fmt: skip
add_command = COMMAND.add_command
