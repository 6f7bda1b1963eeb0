"""`sparkserve llama-benchy`'s parts that need no server: the profiles and their refusals,
the offline corpus, and the join of llama-benchy's rows (a real llama-benchy 0.4.0 result of
the short profile, data/llama-benchy-short.json) with the tests /metrics was read around.
The run against a server is tests/e2e/test_container.py's test 5e."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from sparkserve.bench.benchy import corpus
from sparkserve.bench.benchy.profiles import PROFILES, parse_depths, profile_named
from sparkserve.bench.benchy.report import (
    WHICH_IS_WHICH,
    join,
    markdown,
    metrics_table,
    name_of_test,
    unmeasured,
)
from sparkserve.cli import main
from sparkserve.client import metrics
from sparkserve.command_line import UsageError

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]


def test_the_arena_profile_sends_spark_arenas_v2_sweep() -> None:
    arena = PROFILES["arena-v2"]
    options = arena.llama_benchy_options()
    assert options[:4] == ["--pp", "2048", "--tg", "128"]
    depths = options[options.index("--depth") + 1 : options.index("--concurrency")]
    assert depths[0] == "0" and depths[-1] == "100000"
    levels = options[options.index("--concurrency") + 1 : options.index("--runs")]
    assert levels == ["1", "2", "5", "10"]
    assert "--enable-prefix-caching" in options
    assert "--skip-coherence" not in options and "--exact-tg" not in options
    assert arena.tokens_needed() == 100000 + 2048 + 128


def test_overrides_replace_only_what_is_given() -> None:
    short = PROFILES["short"].with_overrides((0,), None, 3)
    assert (short.depths, short.concurrency, short.runs) == ((0,), (1, 2), 3)


@pytest.mark.parametrize("text", ["", "0,,4", "-1", "4096,4096", "1e3", "0 4096"])
def test_bad_depths_are_refused_in_one_line(text: str) -> None:
    with pytest.raises(UsageError, match=f"bad --depths {text!r}: must be distinct whole"):
        parse_depths(text)


def test_an_unknown_profile_names_the_ones_there_are() -> None:
    with pytest.raises(UsageError, match="bad --profile 'arena': must be one of arena-v2, short"):
        profile_named("arena")


def _exit_of(argv: list[str]) -> int | str | None:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's refusals
        return exc.code


def test_bad_options_exit_2_before_any_request(capsys: pytest.CaptureFixture[str]) -> None:
    # the URL is a closed port: a refusal must come before anything is sent
    url = ["--url", "http://127.0.0.1:9"]
    assert _exit_of(["llama-benchy", *url, "--depths", "4096,4096"]) == 2
    assert _exit_of(["llama-benchy", *url, "--corpus", "web"]) == 2
    assert _exit_of(["llama-benchy", *url, "--runs", "0"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in lines] == ["sparkserve llama-benchy"] * 3, lines


def test_the_offline_corpus_is_the_same_text_every_time_and_seeds_llama_benchys_cache(
    tmp_path: Path,
) -> None:
    first = corpus.prepare("offline", tmp_path / "a")
    second = corpus.prepare("offline", tmp_path / "b")
    assert first == second and first.url == corpus.OFFLINE_URL
    seeded = tmp_path / "a" / ".cache" / "llama-benchy"
    (file,) = seeded.iterdir()
    assert file.name == hashlib.md5(corpus.OFFLINE_URL.encode()).hexdigest() + ".txt"
    text = file.read_text()
    assert len(text) >= corpus.OFFLINE_CHARS
    assert hashlib.sha256(text.encode()).hexdigest() == first.sha256
    assert corpus.prepare("book", None).url == corpus.BOOK_URL


NOTHING_DRAFTED = metrics.acceptance({}, {}, "tiny")  # a server without speculative counters


def _tests() -> list[dict[str, object]]:
    return [{"pp": 512, "tg": 32, "depth": d, "concurrency": c, "cut_short": False,
             "speculation": NOTHING_DRAFTED, "kv_cache_usage_peak": None,
             "prefix_cache": metrics.prefix_hit_rate({}, {}, "tiny")}
            for d in (0, 2048) for c in (1, 2)]  # fmt: skip


def test_rows_join_their_test_in_llama_benchys_order() -> None:
    result = json.loads((DATA / "llama-benchy-short.json").read_text())
    rows = join(result["benchmarks"], _tests())
    assert [(r["depth"], r["concurrency"], r["is_context_prefill_phase"]) for r in rows] == [
        (0, 1, False), (0, 2, False), (2048, 1, True), (2048, 1, False),
        (2048, 2, True), (2048, 2, False)]  # fmt: skip
    # a run cut short: the rows of the tests that began, no more
    assert len(join(result["benchmarks"][:3], _tests())) == 3
    assert name_of_test(_tests()[3]) == "pp512 tg32 @ d2048 (c2)"


def test_rows_out_of_llama_benchys_order_are_refused() -> None:
    result = json.loads((DATA / "llama-benchy-short.json").read_text())
    swapped = [result["benchmarks"][1], result["benchmarks"][0], *result["benchmarks"][2:]]
    with pytest.raises(ValueError, match="row 0 has concurrency 2, its test 1"):
        join(swapped, _tests())


def test_a_figure_llama_benchy_left_blank_is_named_with_why() -> None:
    """A real llama-benchy 0.4.0 result from a loaded CI machine: at c2 both streams reached
    it in one chunk each, so its tg32 (c2) cell is blank; the report says which and why, and a
    full result names nothing."""
    full = json.loads((DATA / "llama-benchy-short.json").read_text())
    assert unmeasured(join(full["benchmarks"], _tests())) == []
    loaded = json.loads((DATA / "llama-benchy-short-one-chunk.json").read_text())
    gaps = unmeasured(join(loaded["benchmarks"], _tests()))
    assert [(g["test"], g["phase"]) for g in gaps] == [("pp512 tg32 (c2)", "tg")]
    assert "one streamed chunk" in gaps[0]["why"]
    document = {
        "llama_benchy": {"version": "0.4.0"}, "profile": {"name": "short"}, "model": "tiny",
        "image": "cpu", "vllm": "0.32.0", "corpus": {"url": "sparkserve:prose-v1"},
        "tests": [], "rows": [], "unmeasured": gaps,
    }  # fmt: skip
    text = markdown(document, "| llama-benchy's table |\n")
    assert f"- pp512 tg32 (c2), tg: {gaps[0]['why']}\n" in text
    assert "Not measured" not in markdown({**document, "unmeasured": []}, "| table |\n")


def test_decode_steps_beside_client_tokens_on_a_recorded_run_and_with_accepted_drafts() -> None:
    """docs/data's recorded `sparkserve llama-benchy` run (CPU, DFlash drafting, nothing
    accepted on random weights): decode steps/s equal client tok/s; the same row where each
    draft had 1.5 tokens accepted: 2.5 tokens a step, so steps/s is tok/s / 2.5. The markdown
    says which is which beside the table."""
    document = json.loads((REPO / "docs" / "data" / "llama_benchy_cpu_drafting.json").read_text())
    benchmarks = document["llama_benchy"]["result"]["benchmarks"]
    (test,) = document["tests"]
    assert test["speculation"]["drafts"] > 0 and test["speculation"]["mean_acceptance_length"] == 1
    (row,) = join(benchmarks, [test])
    client = row["tg_throughput"]["mean"]
    assert row["decode_steps_s"] == client and not row["cut_short"]
    accepting = {**test, "speculation": {**test["speculation"], "accepted": 93.0,
                                         "mean_acceptance_length": 2.5}}  # fmt: skip
    (row,) = join(benchmarks, [accepting])
    assert math.isclose(row["decode_steps_s"], client / 2.5)
    text = markdown({**document, "tests": [accepting], "rows": [row], "unmeasured": []}, "")
    assert WHICH_IS_WHICH in text
    assert "| test | client tok/s | decode steps/s | mean accepted length |" in text
    assert f"| pp512 tg32 (c1) | {client:.1f} | {client / 2.5:.1f} | 2.500 |" in text


def test_a_row_saved_as_its_test_was_cut_short_is_kept_and_labelled() -> None:
    """Ctrl-C may land before or after llama-benchy saved the running test's row: a saved
    row of a test cut short is kept, labelled cut short, in either order."""
    result = json.loads((DATA / "llama-benchy-short.json").read_text())
    tests = [*_tests()[:1], {**_tests()[1], "cut_short": True}]
    before = join(result["benchmarks"][:1], tests)  # the interrupt came first
    after = join(result["benchmarks"][:2], tests)  # llama-benchy saved the second row first
    assert [r["cut_short"] for r in before] == [False]
    assert [(r["concurrency"], r["cut_short"]) for r in after] == [(1, False), (2, True)]
    text = metrics_table(tests, after)
    assert "| pp512 tg32 (c2) (cut short) |" in text
