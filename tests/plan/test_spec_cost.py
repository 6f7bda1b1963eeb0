"""benchmarks/gpu/spec_cost.py's parts that need no GPU: its options, the step figures it takes
from chunk times and tokens, the model curve, the merge of several calls, its JSON and PNG;
and benchmarks/gpu/spec_accept.py, the plugin that sets each step's acceptance: the logits it
hands greedy rejection, and that the folder spec_cost.py writes makes it vLLM's plugin, which
wraps vLLM's own rejection sampler once imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.gpu_benchmarks import load

ROOT = Path(__file__).resolve().parents[2]


sc = load("spec_cost")
sa = load("spec_accept")


def test_the_defaults_are_the_issues_cases() -> None:
    args = sc.parse_args(["--out", "x"])
    assert args.cases == ("plain", "dflash", "mtp") and args.streams == (1, 2)
    assert (args.dflash_tokens, args.mtp_tokens, args.layers) == (12, 2, 48)
    assert args.merge is None and args.deadline_s is None


@pytest.mark.parametrize(
    ("option", "says"),
    [(["--cases", "plain,eagle"], "--cases 'plain,eagle': one or more of plain,dflash,mtp"),
     (["--streams", "1,x"], "comma-separated integers"), (["--streams", "9"], "from 1 to 8"),
     (["--layers", "0"], "--layers '0': each from 1 to 48"),
     (["--steps", "4"], "--steps 4: at least 8"),
     (["--dflash-tokens", "16"], "from 1 to 15"), (["--mtp-tokens", "0"], "from 1 to 8"),
     (["--deadline-s", "-1"], "a positive number"),
     (["--merge", "no-such.json"], "--merge no-such.json: no such file")],
)  # fmt: skip
def test_bad_options_are_refused_by_name(
    option: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        sc.parse_args(["--out", "x", *option])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_the_ends_of_the_acceptance_range_are_measured_first() -> None:
    assert sc.settings_for("plain", 0) == []
    assert sc.settings_for("mtp", 2) == ["own", 0, 2, "all", 1]
    assert sorted(map(str, sc.settings_for("dflash", 12))) == sorted(
        ["own", "all", *map(str, range(13))])  # fmt: skip


def test_step_figures_come_from_chunk_times_and_the_tokens_each_carried() -> None:
    # 3 tokens a step (2 accepted + 1), one chunk a step every 30 ms; the first chunk (the
    # prefill's one token) is not counted; the second stream's chunks join two steps each
    times = [[0.0, 0.03, 0.06, 0.09], [0.0, 0.06, 0.12]]
    tokens = [[1, 3, 3, 3], [1, 6, 6]]
    figures = sc.run_figures(times, tokens, 3.0)
    assert figures["streams"] == 2 and figures["tokens_per_step"] == 3.0
    assert figures["step_s_median"] == pytest.approx(0.03)
    assert figures["tok_s_per_stream_median"] == pytest.approx(100.0)
    assert figures["tok_s_aggregate"] == pytest.approx(200.0)
    assert figures["chunk_gap_s_median"] == pytest.approx(0.03)  # .03 .03 .03 .06 .06
    assert figures["tokens_per_chunk_mean"] == pytest.approx(4.2)  # 3 3 3 6 6
    assert figures["tokens_per_chunk_max"] == 6
    with pytest.raises(ValueError, match="token counts"):
        sc.run_figures([[0.0, 0.1]], [[1]], 1.0)
    with pytest.raises(ValueError, match="fewer than 2 chunks"):
        sc.run_figures([[0.0]], [[1]], 1.0)


def test_the_servers_step_is_its_decode_time_over_the_steps_taken() -> None:
    # two requests decoded 1.2 s between them; 120 tokens after their first, 3 a step
    assert sc.server_step_s(1.2, 2, 120, 3.0) == pytest.approx(0.03)
    assert sc.server_step_s(None, None, 120, 3.0) is None
    # the model takes the server's step where a run has it, else the client's
    assert sc.step_of({"server_step_s": 0.03, "step_s_median": 0.05}) == 0.03
    assert sc.step_of({"server_step_s": None, "step_s_median": 0.05}) == 0.05


def run(case: str, accept: Any, tokens_per_step: float, step_s: float, n: int = 12,
        streams: int = 1, call: int = 1) -> dict[str, Any]:  # fmt: skip
    return {"call": call, "case": case, "accept": accept, "num_spec_tokens": n,
            "streams": streams, "tokens_per_step": tokens_per_step, "step_s_median": step_s,
            "tok_s_per_stream_median": tokens_per_step / step_s}  # fmt: skip


def dflash_runs(call: int = 1) -> list[dict[str, Any]]:
    # plain 20 ms; a DFlash step 30 ms at 0 accepted, 42 ms at 12: 1 ms an accepted draft
    fixed = [run("dflash", k, k + 1.0, 0.030 + 0.001 * k, call=call) for k in range(13)]
    return [run("plain", "own", 1.0, 0.020, 0, call=call),
            run("dflash", "own", 1.0, 0.0301, call=call), *fixed,
            run("dflash", "all", 13.0, 0.0421, call=call)]  # fmt: skip


def test_the_model_interpolates_the_measured_steps_and_reads_the_published_figures() -> None:
    derived = sc.derive(dflash_runs())["cases"]["dflash"]["1"]
    assert derived["measured_step_over_plain_at_0"] == pytest.approx(1.5)
    assert derived["measured_step_over_plain_at_full"] == pytest.approx(2.1)  # k=12, not "all"
    model = {round(p["a"], 1): p for p in derived["model_curve"]}
    assert model[0.0]["model_tok_s"] == pytest.approx(1 / 0.030)
    assert model[6.5]["model_step_s"] == pytest.approx(0.0365)  # between the k=6 and 7 steps
    assert model[6.5]["model_tok_s"] == pytest.approx(7.5 / 0.0365)
    assert model[12.0]["model_speedup"] == pytest.approx(13 / 0.042 * 0.020)
    assert model[12.0]["model_spark_tok_s"] == pytest.approx(28 * 13 / 0.042 * 0.020)
    # break-even: (a + 1) / (0.030 + 0.001 a) = 1 / 0.020 -> a = 0.01 / 0.019
    assert derived["model_break_even_a"] == pytest.approx(0.01 / 0.019)
    # 81 tok/s on the Spark is 81/28 of its plain figure: (a + 1) * 0.02 / (0.03 + 0.001 a)
    implied = derived["model_a_implied_by_published_spark_tok_s"]
    want = (81 / 28 * 0.030 - 0.020) / (0.020 - 81 / 28 * 0.001)
    assert implied["81.0"] == pytest.approx(want, abs=1e-6)
    points = [(float(k), 0.030 + 0.001 * k) for k in range(13)]
    assert sc.implied_a(points, 0.020, 100.0) is None  # beyond full acceptance
    assert sc.implied_a(points, 0.020, 0.5) == 0.0  # below the step at no acceptance


def test_without_set_counts_the_model_runs_from_vllms_own_acceptance_to_all() -> None:
    runs = [run("plain", "own", 1.0, 0.020, 0), run("mtp", "own", 1.1, 0.025, 2),
            run("mtp", "all", 3.0, 0.027, 2)]  # fmt: skip
    assert sc.step_points([r for r in runs if r["case"] == "mtp"]) == [
        (pytest.approx(0.1), 0.025), (2.0, 0.027)]  # fmt: skip
    assert "mtp" in sc.derive(runs)["cases"]
    assert sc.derive(runs[1:])["cases"] == {}  # no plain step to compare with


def test_calls_merge_by_case_on_one_gpu_and_the_latest_call_of_a_case_counts() -> None:
    def record(runs: list[dict[str, Any]], gpu: str = "H200") -> dict[str, Any]:
        return {"gpu": gpu, "geometry": {"layers": 48}, "vllm": "0.33.0",
                "calls": [{"call": 1, "cases": sorted({r["case"] for r in runs})}],
                "runs": runs, "errors": []}  # fmt: skip

    first = record(dflash_runs())
    mtp = [run("mtp", k, k + 1.0, 0.022 + 0.001 * k, 2) for k in range(3)]
    second = record([run("plain", "own", 1.0, 0.021, 0), *mtp])
    merged = sc.merge([first, second])
    assert [c["call"] for c in merged["calls"]] == [1, 2]
    assert {(r["case"], r["call"]) for r in merged["runs"]} == {
        ("plain", 2), ("dflash", 1), ("mtp", 2)}  # fmt: skip
    assert merged["derived"]["cases"]["dflash"]["1"]["plain_step_s"] == 0.021
    assert set(merged["derived"]["cases"]) == {"dflash", "mtp"}
    with pytest.raises(ValueError, match=r"gpu: .*H100.* in one record, .*H200"):
        sc.merge([first, record(mtp, gpu="H100")])
    # one kind of GPU on two machines whose drivers differ: one GPU
    assert sc.merge([record(mtp, gpu="H200, 143771 MiB, 580.1"),
                     record(mtp, gpu="H200, 143771 MiB, 575.2")])["derived"]  # fmt: skip


def test_a_merge_is_written_as_json_and_png_and_a_bad_one_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = {"gpu": "NVIDIA H200, 143771 MiB, 580", "vllm": "0.33.0",
              "geometry": {"layers": 48, "full_depth_layers": 48},
              "calls": [{"call": 1}], "runs": dflash_runs(), "errors": []}  # fmt: skip
    one, two = tmp_path / "a.json", tmp_path / "b.json"
    one.write_text(json.dumps(record))
    two.write_text(json.dumps({**record, "gpu": "NVIDIA H100"}))
    assert sc.main(["--out", str(tmp_path / "out"), "--merge", str(one)]) == 0
    written = json.loads((tmp_path / "out" / "spec_cost.json").read_text())
    assert written["derived"]["cases"]["dflash"]["1"]["num_spec_tokens"] == 12
    png = (tmp_path / "out" / "spec_cost.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert sc.main(["--out", str(tmp_path / "bad"), "--merge", str(one), str(two)]) == 2
    assert "spec_cost: --merge: gpu: " in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_first_k_makes_greedy_rejection_accept_exactly_k_drafts_of_each_request() -> None:
    import torch

    # two requests of 3 and 2 drafts; random target logits over a vocabulary of 50
    generator = torch.Generator().manual_seed(0)
    drafts = torch.tensor([4, 7, 9, 11, 13], dtype=torch.int32)
    cu = torch.tensor([3, 5], dtype=torch.int32)
    logits = torch.randn(5, 50, generator=generator)
    for k in range(4):
        chosen = sa.first_k(drafts, cu, logits, k).argmax(dim=1)
        agrees = (chosen == drafts.long()).tolist()
        positions = [0, 1, 2, 0, 1]
        assert agrees == [p < k for p in positions], k
    assert torch.equal(logits, torch.randn(5, 50, generator=generator.manual_seed(0)))
    empty = torch.empty(0, 50)
    assert sa.first_k(torch.empty(0, dtype=torch.int32), cu, empty, 3) is empty


def test_first_k_v2_biases_each_row_toward_the_token_of_the_row_after_it() -> None:
    import torch

    # Model Runner V2: two requests of 3 and 2 drafts, rows at positions 0..3 | 0..2; row i is
    # checked against the token of row i + 1; the second request's last draft is a placeholder
    draft_sampled = torch.tensor([5, 4, 7, 9, 6, 11, -1], dtype=torch.int32)
    position = torch.tensor([0, 1, 2, 3, 0, 1, 2], dtype=torch.int32)
    logits = torch.randn(7, 50, generator=torch.Generator().manual_seed(1))
    checked = [(0, 4), (1, 7), (2, 9), (4, 11)]  # (row, the draft it decides)
    for k in range(5):
        chosen = sa.first_k_v2(logits, draft_sampled, position, k).argmax(dim=1)
        assert [int(chosen[row]) == draft for row, draft in checked] == [
            int(position[row]) < k for row, _ in checked], k  # fmt: skip
        unchanged = sa.first_k_v2(logits, draft_sampled, position, k)[[3, 5, 6]]
        assert torch.equal(unchanged, logits[[3, 5, 6]])  # bonus rows, the placeholder's


def test_the_plugin_folder_makes_vllm_wrap_its_rejection_sampler(tmp_path: Path) -> None:
    folder = sc.accept_plugin(tmp_path)
    switch = tmp_path / "switch"
    probe = (
        "from importlib.metadata import entry_points\n"
        "(ep,) = [e for e in entry_points(group='vllm.general_plugins')"
        " if e.name == 'sparkserve_spec_accept']\n"
        "ep.load()()\n"
        "import os\n"
        "import vllm.v1.sample.rejection_sampler as v1\n"
        "import vllm.v1.worker.gpu.spec_decode.rejection_sampler as v2\n"
        "for r in (v1, v2):\n"
        "    print(r.rejection_sample.__wrapped__.__module__,"
        " os.path.basename(r.rejection_sample.__code__.co_filename))\n"
    )
    paths = os.pathsep.join([str(folder), str(ROOT / "tests" / "cpu_shims" / "src")])
    env = {**os.environ, "PYTHONPATH": paths, sc.SWITCH_ENV: str(switch)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [
        "vllm.v1.sample.rejection_sampler", "sparkserve_spec_accept.py",
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils", "sparkserve_spec_accept.py",
    ]  # fmt: skip
    # without the switch's variable the plugin does nothing
    env.pop(sc.SWITCH_ENV)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode != 0 and "__wrapped__" in done.stderr


def test_a_case_is_not_started_past_the_deadline_and_the_record_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    out = tmp_path / "out"
    argv = ["--out", str(out), "--geometry", "tiny", "--layers", "4", "--cases", "plain,mtp",
            "--deadline-s", "30"]  # fmt: skip
    assert sc.main(argv) == 1
    record = json.loads((out / "spec_cost.json").read_text())
    assert record["runs"] == [] and record["calls"][0]["cases"] == ["plain", "mtp"]
    assert [e.split(":")[0] for e in record["errors"]] == ["plain", "mtp"]
    assert "not started" in record["errors"][0] and not (out / "spec_cost.png").exists()
    assert not list((out / "work").glob("server-*.log"))  # no server was started


def test_a_geometry_that_cannot_be_built_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert sc.main(["--out", str(tmp_path / "out"), "--geometry", "tiny", "--layers", "9"]) == 2
    assert capsys.readouterr().err.strip() == (
        "spec_cost: --layers 9: must be from 1 to 4 for this geometry")  # fmt: skip
    assert not (tmp_path / "out").exists()
