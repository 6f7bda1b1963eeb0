"""How the decode step grows with depth, from decode_speed.py's records of one GPU at several
depths (h200.sh decode-speed with LAYERS=N): where the GPU cannot hold all 48 layers, the
step at 48 is read off a straight line through the two deepest runs (a model, labelled so).

    python3 benchmarks/gpu/layer_scaling.py --out DIR RECORD.json [RECORD.json ...]

Writes DIR/<stem>.json and .png (--stem, default layer_scaling): for each head and stream count
that every record ran, the step time by depth, the slope per layer, the step at full depth by
that line and the ratio of each step to its bytes at the measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from served import save_figure, write_json

from sparkserve.plan.step_bytes import geometry, quantization, step_bytes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stem", default="layer_scaling")
    parser.add_argument("records", type=Path, nargs="+")
    args = parser.parse_args(argv)
    for path in args.records:
        if not path.is_file():
            parser.error(f"{path}: no such record (decode_speed.json of one run)")
    return args


def load(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The records, shallowest first; one GPU model, one depth each."""
    records = sorted((json.loads(p.read_text()) for p in paths),
                     key=lambda r: r["settings"]["layers"])  # fmt: skip
    gpus = {r["gpu"].split(",")[0] for r in records}
    if len(gpus) != 1:
        raise ValueError(f"records of several GPUs ({', '.join(sorted(gpus))}): one at a time")
    depths = [r["settings"]["layers"] for r in records]
    if len(set(depths)) != len(depths) or len(depths) < 2:
        raise ValueError(f"depths {depths}: two or more, each once")
    return records


def line_through(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Slope and intercept of the straight line through the two deepest points."""
    (x0, y0), (x1, y1) = sorted(points)[-2:]
    slope = (y1 - y0) / (x1 - x0)
    return slope, y1 - slope * x1


def scaling(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    full = records[-1]["geometry"]["full_depth_layers"]
    config = dict(records[-1]["geometry"]["config"], num_hidden_layers=full)
    copy_gbs = min(r["copy_bandwidth_gbs"] for r in records)
    rows = []
    keys = set.intersection(*({(d["head"], d["streams"]) for d in r["decode"]} for r in records))
    for head, streams in sorted(keys):
        steps = [
            (r["settings"]["layers"], d["step_s_median"], d["model_bytes_per_step"])
            for r in records for d in r["decode"] if (d["head"], d["streams"]) == (head, streams)
        ]  # fmt: skip
        slope, intercept = line_through([(layers, step) for layers, step, _ in steps])
        context = records[-1]["decode"][0]["context_mean"]
        full_bytes = step_bytes(geometry(config), quantization(config), head=head,
                                context=context, streams=streams).total  # fmt: skip
        full_step = intercept + slope * full
        rows.append({
            "head": head, "streams": streams,
            "measured": [{"layers": layers, "step_s": step,
                          "ratio_to_bytes_over_copy_bw": step / (b / (copy_gbs * 1e9))}
                         for layers, step, b in steps],
            "model_step_s_per_layer": slope, "model_step_s_at_0_layers": intercept,
            "model_full_depth_layers": full, "model_step_s_at_full_depth": full_step,
            "model_tok_s_per_stream_at_full_depth": 1 / full_step,
            "model_bytes_per_step_at_full_depth": full_bytes,
            "model_ratio_at_full_depth": full_step / (full_bytes / (copy_gbs * 1e9)),
        })  # fmt: skip
    return rows


def write_png(path: Path, record: Mapping[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.2))
    for row in record["rows"]:
        label = f"{row['head']} head, {row['streams']} stream(s)"
        layers = [m["layers"] for m in row["measured"]]
        line = axis.plot(layers, [m["step_s"] * 1e3 for m in row["measured"]], "o",
                         label=f"{label}: measured")[0]  # fmt: skip
        full = row["model_full_depth_layers"]
        span = [min(layers), full]
        axis.plot(span, [(row["model_step_s_at_0_layers"] + row["model_step_s_per_layer"] * x)
                         * 1e3 for x in span], "--", color=line.get_color(),
                  label=f"{label}: line through the two deepest (model)")  # fmt: skip
    axis.set_xlabel("layers of the target's 48")
    axis.set_ylabel("decode step (ms)")
    axis.legend(fontsize=7)
    save_figure(
        figure,
        path,
        f"Decode step by depth: {record['gpu']}, vLLM {record['vllm']}, dummy int4 weights",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        records = load(args.records)
    except ValueError as error:
        print(f"layer_scaling: {error}", file=sys.stderr)
        return 2
    record = {
        "what": "decode step by depth from decode_speed.py's records; model_* fields are a "
                "straight line through the two deepest runs, not a measurement",
        "gpu": records[-1]["gpu"], "vllm": records[-1]["vllm"],
        "copy_bandwidth_gbs": min(r["copy_bandwidth_gbs"] for r in records),
        "records": [{"layers": r["settings"]["layers"], "date": r["date"]} for r in records],
        "rows": scaling(records),
    }  # fmt: skip
    write_json(args.out / f"{args.stem}.json", record)
    write_png(args.out / f"{args.stem}.png", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
