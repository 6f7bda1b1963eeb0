"""`sparkserve plan --nodes 2` against vLLM itself, for the Spark's 122B geometry.

1. vLLM's own parser and engine config take the pair's command line (`--nnodes 2
   --node-rank R --master-addr ... --tensor-parallel-size 2`, and the same with
   `--pipeline-parallel-size 2`) with the DFlash drafter, and derive world size 2 over two
   nodes; vLLM's own model class, built on the meta device in a real two-rank gloo group, holds
   on each rank exactly the bytes and layers the plan puts on each node (bf16 geometry, where
   the checkpoint's size is vLLM's own count of the whole model).
2. The pair's memory and speed follow one node's definitions: each node keeps OS_RESERVE_GB,
   the KV pool is what vLLM lays out with the smaller node's memory, the link's cost is the
   stated assumption, and the head's int8 reclaim is the rows each node holds.
3. Bad cluster input: one line naming the value, exit 2, nothing printed on stdout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_plan import SPARK_ARGS

from support.geometry import write_geometry_models
from support.plan_runs import plan_cli, plan_runs
from support.vllm_server import free_port

REPO = Path(__file__).resolve().parents[2]
RANK = REPO / "tests" / "scenarios" / "pair_rank.py"
GIB = 2**30
HIDDEN, LAYERS, VOCAB = 3072, 48, 248320


@pytest.fixture(scope="module")
def geometry(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_geometry_models(tmp_path_factory.mktemp("pair-geometry"))


def run_ranks(
    geometry: tuple[Path, Path], layouts: tuple[str, ...], work: Path
) -> dict[str, list[dict[str, Any]]]:
    """Each rank in a process of its own, playing every layout in turn (rank 0 alone in
    "one"); each layout's group on a port of its own."""
    ports = {layout: str(free_port()) for layout in layouts}
    started = []
    for rank in range(2):
        mine = [layout for layout in layouts if rank == 0 or layout != "one"]
        mine_ports = ",".join(ports[layout] for layout in mine)
        command = [sys.executable, RANK, *geometry, ",".join(mine), rank, mine_ports, work]
        proc = subprocess.Popen(
            list(map(str, command)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        started.append(proc)
    try:
        outputs = [proc.communicate(timeout=300)[0] for proc in started]
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, output in zip(started, outputs, strict=True):
        assert proc.returncode == 0, output[-3000:]
    return {
        layout: [
            json.loads((work / f"{layout}-{rank}.json").read_text())
            for rank in range(1 if layout == "one" else 2)
        ]
        for layout in layouts
    }


@pytest.fixture(scope="module")
def ranks(geometry: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What vLLM builds on one node (the whole model) and on each rank of tp and pp."""
    return run_ranks(geometry, ("one", "tp", "pp"), tmp_path_factory.mktemp("ranks"))


@pytest.fixture(scope="module")
def plans(
    geometry: tuple[Path, Path], ranks: dict, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """At the Spark's settings: one node's plan, the pair's with tp through the options and
    pp through the knobs CLUSTER_NODES / CLUSTER_LAYOUT, an option over those knobs (as a
    table); and, for the checks against vLLM, the pair's plans of the bf16 checkpoint vLLM
    builds for one node (227 GiB, so on larger machines)."""
    target, drafter = geometry
    spark = ["--model", str(target), "--drafter", str(drafter), *SPARK_ARGS]
    pair_env = {"CLUSTER_NODES": "2", "CLUSTER_LAYOUT": "pp"}
    whole = ["--weights-gib", repr(ranks["one"][0]["param_bytes"] / GIB), "--mem-total-gib", "512"]
    cases = {
        "one": ([*spark, "--json"], {}),
        "tp": ([*spark, "--nodes", "2", "--layout", "tp", "--json"], {}),
        "pp": ([*spark, "--json"], pair_env),
        "option": (
            [*spark, "--layout", "tp", "--link-latency-us", "0", "--method", "mtp",
             "--num-spec-tokens", "2"],
            pair_env,
        ),
        "bf16-tp": ([*spark, "--nodes", "2", "--layout", "tp", "--json", *whole], {}),
        "bf16-pp": ([*spark, "--nodes", "2", "--layout", "pp", "--json", *whole], {}),
    }  # fmt: skip
    runs = plan_runs(cases, tmp_path_factory.mktemp("plans"))
    for name, (status, out, err) in runs.items():
        assert status == 0, (name, out[-2000:], err[-2000:])
    return {
        name: out if name == "option" else json.loads(out) for name, (_, out, _) in runs.items()
    }


@pytest.mark.parametrize("layout", ["tp", "pp"])
def test_vllm_builds_the_pair_and_shards_as_planned(ranks: dict, plans: dict, layout: str) -> None:
    built = ranks[layout]
    size = "tensor_parallel_size" if layout == "tp" else "pipeline_parallel_size"
    for rank, facts in enumerate(built):
        assert facts["world_size"] == 2 and facts["nnodes"] == 2, facts
        assert facts["node_rank"] == rank and facts[size] == 2, facts
        assert facts["executor"] == "mp" and facts["master_addr"] == "192.168.100.1", facts
        assert facts["dtype"] == "torch.bfloat16"
    # the plan, told the checkpoint holds what vLLM builds for one node, must put on each node
    # exactly what vLLM builds there
    whole = ranks["one"][0]["param_bytes"]
    plan = plans[f"bf16-{layout}"]
    nodes = plan["nodes"]
    for facts, node in zip(built, nodes, strict=True):
        print(layout, node["role"], node["weights_bytes"], facts["param_bytes"])
        # --weights-gib travels as GiB in a float: a few bytes of rounding
        assert abs(node["weights_bytes"] - facts["param_bytes"]) < 64, (node, facts)
        assert node["layers"] == facts["layers"], (node["layers"], facts["layers"])
    if layout == "tp":
        assert built[0]["kv_heads_per_rank"] == 1  # 2 KV heads, one per node
        assert built[0]["draft_tensor_parallel_size"] == 2  # the drafter is split as well
        assert sum(node["weights_bytes"] for node in nodes) > whole  # replicated parts
        attention = [g for g in nodes[0]["kv"]["groups"] if g["kind"] == "attention"]
        target = [g for g in attention if not g["draft_layers"]]
        per_token = target[0]["real_page_bytes"] / target[0]["block_size"]
        # K and V of the node's heads, bf16, per layer and token (a page is one layer's)
        assert per_token == 2 * built[0]["kv_heads_per_rank"] * built[0]["head_size"] * 2
    else:
        assert built[0]["pp_indices"] == [[0, 24], [24, 48]]
        assert [node["layers"] for node in nodes] == built[0]["pp_indices"]
        # the whole drafter (its KV layers) on the last stage only
        drafted = [sum(g["draft_layers"] for g in node["kv"]["groups"]) for node in nodes]
        assert drafted == [0, 6]
        # vLLM's own check refuses DFlash across stages on this model; the plan says so
        refusal = "Qwen3_5MoeForCausalLM does not support dflash with pipeline parallelism"
        assert built[1]["dflash_over_pp"] == refusal
        assert "does not serve DFlash with pipeline parallelism" in " ".join(plan["notes"])


@pytest.mark.parametrize("layout", ["tp", "pp"])
def test_pair_memory_follows_one_nodes_rules(plans: dict[str, dict], layout: str) -> None:
    one, plan = plans["one"], plans[layout]
    print(layout, json.dumps({k: plan[k] for k in ("pool_tokens", "max_concurrency")}))
    assert plan["fits"] is True and plan["layout"] == layout
    assert plan["largest_gpu_mem"] == one["largest_gpu_mem"] == 0.88
    fitting = []
    for node in plan["nodes"]:
        # each host: GPU_MEM's share, the same OS budget as one Spark
        assert node["os_left_bytes"] == one["os_left_bytes"]
        resident = (
            node["weights_bytes"] + node["drafter_weights_bytes"] - node["lmhead_reclaim_bytes"]
        )
        assert node["kv_bytes"] == node["vllm_share_bytes"] - resident - 3 * GIB
        fitting.append(node["kv_bytes"] // node["kv"]["bytes_per_block"])
    # vLLM gives every node the smaller node's block count
    assert [node["kv"]["num_blocks"] for node in plan["nodes"]] == [min(fitting)] * 2
    # each node holds half of every token's KV in more than twice one node's KV memory; with
    # pp the last stage also holds the whole drafter's KV, and sets the pool
    assert plan["pool_tokens"] > (4 if layout == "tp" else 2) * one["kv"]["pool_tokens"]
    assert plan["max_concurrency"] == pytest.approx(plan["pool_tokens"] / 262144, rel=0.01)
    reclaim = [node["lmhead_reclaim_bytes"] for node in plan["nodes"]]
    rows = [VOCAB // 2] * 2 if layout == "tp" else [0, VOCAB]
    assert reclaim == [r * (HIDDEN - 4) for r in rows]  # int8 copy + fp32 scale per row
    check_link_and_ceiling(plan, one)


def check_link_and_ceiling(plan: dict[str, Any], one: dict[str, Any]) -> None:
    link, ceiling = plan["link"], plan["decode_ceiling"]
    assert link["gbps"] == 200 and link["latency_us"] == 20  # the stated defaults
    crossings = 2 * LAYERS + 3 if plan["layout"] == "tp" else 2
    assert link["crossings_per_token"] == crossings
    wire = link["bytes_per_token"] / 25e9
    assert link["seconds_per_token"] == pytest.approx(crossings * 20e-6 + wire)
    one_short = one["decode_ceiling"]["datasheet_short_context"]
    if plan["layout"] == "tp":  # both read half at once: faster, less the link's cost
        assert ceiling["datasheet_short_context_no_link"] > 1.8 * one_short
        assert ceiling["datasheet_short_context"] < ceiling["datasheet_short_context_no_link"]
    else:  # the stages read one after the other: no faster than one node
        assert ceiling["datasheet_short_context"] <= one_short
        assert "DFlash with pipeline parallelism" in " ".join(plan["notes"])


def test_an_option_wins_over_the_cluster_knobs(plans: dict) -> None:
    """(The pp plan came from CLUSTER_NODES / CLUSTER_LAYOUT alone.) An option wins over the
    knob; the table states the link's assumption; MTP has no drafter to split."""
    table = plans["option"]
    assert "tp: tensor parallel" in table
    assert "assumed 200 Gb/s, 0 us per crossing" in table
    assert re.search(r"^drafter per node +0\.00 GiB / 0\.00 GiB", table, re.MULTILINE), table
    assert re.search(r"^verdict +fits on both nodes$", table, re.MULTILINE), table


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--nodes", "3"], {}, "CLUSTER_NODES='3': must be an integer from 1 to 2"),
        (["--nodes", "2", "--layout", "ring"], {}, "CLUSTER_LAYOUT='ring': must be one of tp"),
        ([], {"CLUSTER_NODES": "two"}, "CLUSTER_NODES='two': must be an integer"),
        (["--layout", "pp"], {}, "--layout='pp': applies to two nodes"),
        (["--nodes", "2", "--link-gbps", "0"], {}, "--link-gbps='0': must be a number from 1"),
        (["--nodes", "2", "--link-latency-us", "-1"], {}, "--link-latency-us='-1': must be"),
    ],
)
def test_bad_cluster_input_is_one_line(args: list[str], env: dict, expected: str) -> None:
    done = plan_cli(*args, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert done.stdout == ""


def test_without_vllm_the_pair_plan_stops_with_one_line(geometry: tuple[Path, Path]) -> None:
    """The split needs vLLM's own rules: where vLLM cannot be imported, exit 3 and say so."""
    target, _ = geometry
    hide_vllm = (
        "import sys; sys.modules['vllm'] = None; from sparkserve.cli import main; "
        f"sys.exit(main(['plan', '--model', {str(target)!r}, '--weights-gib', '67', "
        "'--method', 'none', '--nodes', '2']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", hide_vllm], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith("sparkserve plan: --nodes 2 needs vLLM's sharding rules: vLLM")
    assert len(done.stderr.strip().splitlines()) == 1
