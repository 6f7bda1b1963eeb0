"""benchmarks/gpu/decode_speed.py's parts that need no GPU: its options, the figures it
derives from token arrival times, the ratio to the bytes model, and its JSON and PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkserve.plan.step_bytes import geometry, quantization, step_bytes
from support.gpu_benchmarks import load

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "qwen3.5-122b-a10b" / "config.json"


ds = load("decode_speed")


def test_the_defaults_are_the_issues_cases() -> None:
    args = ds.parse_args(["--out", "x"])
    assert args.streams == (1, 2, 4, 8) and args.heads == ("int8", "bf16")
    assert args.prefill == (2048, 8192, 32768) and args.layers == 48


@pytest.mark.parametrize(
    ("option", "says"),
    [(["--streams", "1,x"], "comma-separated integers"), (["--streams", "0"], "from 1 to 64"),
     (["--heads", "fp8"], "--heads 'fp8': one or more of int8,bf16"),
     (["--layers", "49"], "from 1 to 48"),
     (["--gen-tokens", "2"], "at least 8")],
)  # fmt: skip
def test_bad_options_are_refused_by_name(
    option: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        ds.parse_args(["--out", "x", *option])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_decode_figures_come_from_the_token_arrival_times() -> None:
    # stream A: a token every 10 ms (100 tok/s); stream B: every 20 ms (50 tok/s)
    summary = ds.decode_summary([[0.0, 0.01, 0.02, 0.03], [0.0, 0.02, 0.04]])
    assert summary["streams"] == 2
    assert summary["step_s_median"] == pytest.approx(0.01)  # gaps .01 .01 .01 .02 .02
    assert summary["tok_s_per_stream_median"] == pytest.approx(75)
    assert summary["tok_s_aggregate"] == pytest.approx(150)
    with pytest.raises(ValueError, match="fewer than 2 tokens"):
        ds.decode_summary([[0.0]])


def test_the_ratio_is_step_time_over_bytes_at_the_copy_bandwidth() -> None:
    # 5 GB at 500 GB/s take 10 ms; a 20 ms step is twice the memory limit
    assert ds.model_ratio(0.020, 5e9, 500.0) == pytest.approx(2.0)
    config = json.loads(RECIPE.read_text())
    summary = {"streams": 1, "step_s_median": 0.0125, "tok_s_per_stream_median": 80.0,
               "tok_s_aggregate": 80.0}  # fmt: skip
    row = ds.decode_row(config, "int8", summary, 192, 2000.0)
    expected = step_bytes(geometry(config), quantization(config), head="int8", context=192)
    assert row["model_bytes_per_step"] == expected.total
    assert row["ratio_step_to_bytes_over_copy_bw"] == pytest.approx(
        0.0125 * 2000e9 / expected.total
    )
    assert row["model_ceiling_tok_s_at_copy_bw"] == pytest.approx(2000e9 / expected.total)
    assert "ratio_step_to_bytes_over_copy_bw" not in ds.decode_row(config, "int8", summary, 0, None)


def test_the_int8_gain_pairs_the_heads_by_stream_count() -> None:
    rows = [{"head": "int8", "streams": 1, "tok_s_per_stream_median": 60.0},
            {"head": "bf16", "streams": 1, "tok_s_per_stream_median": 50.0},
            {"head": "int8", "streams": 2, "tok_s_per_stream_median": 40.0}]  # fmt: skip
    assert ds.int8_gain(rows) == {1: pytest.approx(1.2)}


def test_the_json_and_png_are_written(tmp_path: Path) -> None:
    config = json.loads(RECIPE.read_text())
    decode = [
        ds.decode_row(config, head, {"streams": s, "step_s_median": 0.01 * s,
                                     "tok_s_per_stream_median": 100.0 / s,
                                     "tok_s_aggregate": 100.0}, 192, 3000.0)
        for head in ("int8", "bf16") for s in (1, 2)
    ]  # fmt: skip
    record = {
        "gpu": "a GPU", "vllm": "0.0", "settings": {"layers": 48},
        "geometry": {"full_depth_layers": 48}, "decode": decode,
        "prefill": [{"prompt_tokens": 2048, "prefill_tok_s": 9000.0},
                    {"prompt_tokens": 8192, "prefill_tok_s": 8000.0}],
    }  # fmt: skip
    ds.write_json(tmp_path / "d.json", record)
    assert json.loads((tmp_path / "d.json").read_text())["decode"][0]["head"] == "int8"
    ds.write_png(tmp_path / "d.png", record)
    assert (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
