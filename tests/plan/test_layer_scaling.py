"""benchmarks/gpu/layer_scaling.py: the line through the two deepest runs, the records it
refuses, and its JSON and PNG from decode_speed.py-shaped records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkserve.plan.step_bytes import geometry, quantization, step_bytes
from support.gpu_benchmarks import load

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "qwen3.5-122b-a10b" / "config.json"


ls = load("layer_scaling")


def record(
    layers: int, step_ms: float, gpu: str = "NVIDIA H100 80GB HBM3, 81559 MiB"
) -> dict[str, Any]:
    config = dict(json.loads(RECIPE.read_text()), num_hidden_layers=layers)
    total = step_bytes(geometry(config), quantization(config), head="int8", context=192,
                       streams=1).total  # fmt: skip
    return {
        "gpu": gpu, "vllm": "0.33.0", "date": "2026-12-06 19:37 UTC", "copy_bandwidth_gbs": 3000.0,
        "settings": {"layers": layers},
        "geometry": {"full_depth_layers": 48, "config": config},
        "decode": [{"head": "int8", "streams": 1, "step_s_median": step_ms / 1e3,
                    "model_bytes_per_step": total, "context_mean": 192}],
    }  # fmt: skip


def write(tmp_path: Path, *records: dict[str, Any]) -> list[Path]:
    paths = []
    for i, one in enumerate(records):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps(one))
        paths.append(path)
    return paths


def test_the_line_goes_through_the_two_deepest_points() -> None:
    slope, intercept = ls.line_through([(32, 4.0), (8, 2.5), (16, 2.0)])
    assert slope == pytest.approx(2.0 / 16) and intercept == pytest.approx(0.0)


def test_full_depth_is_read_off_the_line_and_the_ratio_uses_the_full_bytes(tmp_path: Path) -> None:
    paths = write(tmp_path, record(32, 4.0), record(16, 2.0), record(8, 2.5))
    assert ls.main(["--out", str(tmp_path / "out"), *map(str, paths)]) == 0
    out = json.loads((tmp_path / "out" / "layer_scaling.json").read_text())
    (row,) = out["rows"]
    assert [m["layers"] for m in row["measured"]] == [8, 16, 32]
    assert row["model_step_s_at_full_depth"] == pytest.approx(6.0e-3)
    assert row["model_tok_s_per_stream_at_full_depth"] == pytest.approx(1 / 6.0e-3)
    full = json.loads(RECIPE.read_text())
    expected = step_bytes(geometry(full), quantization(full), head="int8", context=192, streams=1)
    assert row["model_bytes_per_step_at_full_depth"] == expected.total
    assert (tmp_path / "out" / "layer_scaling.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ((record(32, 4.0), record(16, 2.0, gpu="NVIDIA H200, 143771 MiB")), "several GPUs"),
        ((record(32, 4.0), record(32, 4.1)), "each once"),
        ((record(32, 4.0),), "two or more"),
    ],
)
def test_records_that_cannot_be_lined_up_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], records: tuple[dict[str, Any], ...],
    message: str,
) -> None:  # fmt: skip
    assert ls.main(["--out", str(tmp_path / "out"), *map(str, write(tmp_path, *records))]) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
