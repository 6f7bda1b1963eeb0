"""Cold and warm starts of serve.sh on a CUDA host, with the Spark default's geometry.

What a start fills and what it leaves for the KV pool, per case, on a GPU the project borrows
(an H200, not a GB10; benchmarks/gpu/h200.sh installs vLLM's CUDA build there and calls this):

- a model of the default recipe's geometry (recipes/qwen3.5-122b-a10b: vocab 248320, hidden
  3072, 2 KV heads x 256, GatedDeltaNet 16/64 heads x 128, the real DFlash drafter) with fewer
  layers, `--load-format dummy`, written as `sparkserve selftest` writes it
  (sparkserve.selftest.models): no download, no weights;
- each case is one start of the launcher with the shipped defaults (GPU_MEM 0.82, prefix
  caching, the int8 head, CUDA graphs, DFlash n=12) and a fresh HOME, as a new container has:
  `cold` on a fresh model-cache volume (HF_HOME), `recreated` on the volume an earlier case
  filled (a `compose down` and `up`), `bf16` with SPARK_KEEP_BF16_LMHEAD=1 (then
  `bf16-recreated`), `nocal` with the head's calibration off (SPARK_LMHEAD_CALIBRATE=off:
  the built-in table); `stop-at-load` and `stop-at-load-unpatched` on the volume `cold`
  filled: a SIGTERM to the launcher alone (`docker stop`) once the engine core logs its first
  line, with vLLM as the image patches it and with the startup-stop patch reverted;
  `extensible` (on a fresh volume of its own) and `extensible-recreated` (on the volume `cold`
  filled): vLLM 0.34's extensible KV cache on (`--enable-extensible-kv-cache` in EXTRA_ARGS,
  after the launcher's `--no-enable-extensible-kv-cache`: the last flag wins), GPU_MEM then a
  cap rather than the pool's budget; `stock-layout` (on a fresh volume of its own) and
  `stock-layout-recreated` (its volume again): vLLM without the image's hybrid-page-divide
  patch (`sparkserve patch hybrid-page-divide --revert` for the start, applied again after:
  issue 50, docs/PATCHES.md);
- the cases of PREFIX_PROBE (`cold`, `recreated` and the stock-layout ones) then send a
  2,800-token prompt twice (32 tokens each, so DFlash drafts) and keep the second send's
  prefix-cache hits, the speculative counters, vLLM's KV group and hit-unit lines, and the
  pool `sparkserve plan` predicts for the KV memory vLLM logged (`--stock-layout` where the
  case reverted the patch) beside the pool vLLM logged;
- per case: seconds to healthy, vLLM's memory lines (available KV memory, KV tokens, the
  profiler's parts, the extensible KV cache's size), the GPU's memory free and used once
  healthy and after the completion (nvidia-smi: the whole device), the head's report, one
  completion, the stop's exit code and seconds, and what the start left in every cache on the
  volume and outside it (HOME, /tmp).

Writes OUT/starts.json and OUT/<case>.log; prints a table. A case that would not finish
before --deadline-s is skipped and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sparkserve.client import metrics
from sparkserve.knobs.registry import stop_grace_s
from sparkserve.launch.vllm_command import start_caches
from sparkserve.selftest.models import write_models

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "qwen3.5-122b-a10b"
KEY = "gpu-check-key"
STOP_GRACE_S = float(stop_grace_s())  # docker-compose.yml's stop_grace_period
PORT = 8123
# what serve.sh passes on the H200 host that the Spark image does not need: no flashinfer in
# the bundle (FACTS "vLLM's CUDA build on an H200 host")
HOST_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
HOST_ARGS = '--additional-config \'{"gdn_prefill_backend": "triton"}\''
# the caches sparkserve.launch.vllm_command.start_caches puts on the volume, and the calibration's
VOLUME_CACHES = (*(Path(path).name for path in start_caches("").values()), "sparkserve")
MEMORY_LINES = (
    "Available KV cache memory", "GPU KV cache size", "Model loading took", "memory profiling",
    "Memory profiling", "non_torch", "activation peak", "CUDA graph", "Graph capturing",
    "sparkserve int8 lm-head", "init engine", "torch.compile", "Compil", "calibrat",
    "Maximum concurrency", "xtensible KV cache", "Extended KV cache", "Remapping the KV cache",
    "caps this instance", "Memory after warmup", "kv cache group sizes", "kv lcm block sizes",
    "sparkserve patch",
)  # fmt: skip
# case: (its volume, whether the case empties it first, its knobs)
CASES: dict[str, tuple[str, bool, dict[str, str]]] = {
    "cold": ("a", True, {}),
    "recreated": ("a", False, {}),
    "bf16": ("b", True, {"SPARK_KEEP_BF16_LMHEAD": "1"}),
    "bf16-recreated": ("b", False, {"SPARK_KEEP_BF16_LMHEAD": "1"}),
    "nocal": ("c", True, {"SPARK_LMHEAD_CALIBRATE": "off"}),
    "stop-at-load": ("a", False, {}),
    "stop-at-load-unpatched": ("a", False, {}),
    "extensible": ("e", True, {}),
    "extensible-recreated": ("a", False, {}),
    "stock-layout": ("s", True, {}),
    "stock-layout-recreated": ("s", False, {}),
}
# Cases served by vLLM without the image's hybrid-page-divide patch (applied again after)
STOCK_LAYOUT = ("stock-layout", "stock-layout-recreated")
# Cases that send the prefix probe: a prompt of PROBE_TOKENS sent twice
PREFIX_PROBE = ("cold", "recreated", *STOCK_LAYOUT)
PROBE_TOKENS = 2800  # the selftest's models' tokenizer: one token per byte
# vLLM arguments a case adds after the host's (EXTRA_ARGS come last in the launcher's argv)
CASE_ARGS = {
    "extensible": "--enable-extensible-kv-cache",
    "extensible-recreated": "--enable-extensible-kv-cache",
}
# Cases stopped, as `docker stop` stops a container (SIGTERM to the launcher alone), once the
# engine core's first line shows: the startup-stop patch's window (docs/PATCHES.md). The
# unpatched case reverts the patch for its start and applies it again after. The stop is given
# docker-compose.yml's stop_grace_period before its SIGKILL.
STOP_AT_LOAD = {"stop-at-load": True, "stop-at-load-unpatched": False}
ENGINE_STARTED = "(EngineCore"


@dataclass
class Start:
    case: str
    volume: str
    healthy_s: float | None = None
    kv_gib: float | None = None
    kv_tokens: int | None = None
    head: str = ""
    completion: str = ""
    stop_exit: int | None = None
    stop_s: float | None = None
    memory_lines: list[str] = field(default_factory=list)
    volume_files: dict[str, list[int]] = field(default_factory=dict)  # [files, bytes]
    new_files: dict[str, int] = field(default_factory=dict)
    outside: list[str] = field(default_factory=list)
    skipped: str = ""
    stopped_after_s: float | None = None  # stop-at-load cases: the SIGTERM, after the start
    gpu_used_mib_after: int | None = None  # stop-at-load cases: the GPU's memory once it exited
    extended_kv_gib: float | None = None  # the extensible KV cache's size after warm-up
    gpu_memory_healthy: dict[str, int] = field(default_factory=dict)  # MiB, once healthy
    gpu_memory_served: dict[str, int] = field(default_factory=dict)  # MiB, after the completion
    # PREFIX_PROBE cases: the second send's prompt tokens and hits, the speculative counters
    # after both sends, and the plan's pool and hit unit for the KV memory vLLM logged
    probe: dict[str, float] = field(default_factory=dict)
    predicted: dict[str, int | None] = field(default_factory=dict)


def files_under(path: Path) -> dict[str, int]:
    if not path.exists():
        return {}
    return {str(p): p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()}


def inventory(volume: Path) -> dict[str, dict[str, int]]:
    return {name: files_under(volume / name) for name in VOLUME_CACHES}


def request(path: str, body: dict | None = None, timeout: float = 5) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}", data=data,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def launcher_env(case: str, models: tuple[Path, Path], volume: Path, home: Path) -> dict:
    target, drafter = models
    env = dict(os.environ, **HOST_ENV, **CASES[case][2])
    env.update(
        MODEL=str(target), DRAFT_MODEL=str(drafter), SERVED_MODEL_NAME="spark-geometry",
        LOAD_FORMAT="dummy", HF_HOME=str(volume), HOME=str(home), PORT=str(PORT),
        HOST="127.0.0.1", API_KEY=KEY, HF_OFFLINE="1", EXTRA_ARGS=HOST_ARGS,
        TOOL_PARSER="", REASONING_PARSER="",
    )  # fmt: skip
    if case in CASE_ARGS:
        env["EXTRA_ARGS"] = f"{HOST_ARGS} {CASE_ARGS[case]}"
    return env


def parse_log(log: str, start: Start) -> None:
    start.memory_lines = [
        line[-240:] for line in log.splitlines() if any(w in line for w in MEMORY_LINES)
    ][:60]
    if found := re.findall(r"Available KV cache memory: ([\d.]+) GiB", log):
        start.kv_gib = float(found[-1])
    if found := re.findall(r"GPU KV cache size: ([\d,]+) tokens", log):
        start.kv_tokens = int(found[-1].replace(",", ""))
    if found := re.findall(r"Extended KV cache to \d+ blocks \(([\d.]+) GiB\)", log):
        start.extended_kv_gib = float(found[-1])
    heads = [line for line in log.splitlines() if "sparkserve int8 lm-head" in line]
    start.head = heads[-1][-400:] if heads else "no report"


def patch_startup_stop(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "sparkserve", "patch", "startup-stop", *args],
                   check=True)  # fmt: skip


def patch_page_divide(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "sparkserve", "patch", "hybrid-page-divide", *args],
                   check=True)  # fmt: skip


def metrics_now() -> dict:
    status, body = request("/metrics", timeout=10)
    return metrics.parse(body) if status == 200 else {}


def prefix_probe(case: str, start: Start) -> None:
    """A PROBE_TOKENS prompt sent twice: the second send's hits, and the drafts accepted."""
    prompt = "".join(random.Random(50).choices("abcdefghijklmnopqrstuvwxyz ", k=PROBE_TOKENS))
    body = {"model": "spark-geometry", "prompt": prompt, "max_tokens": 32, "temperature": 0}
    request("/v1/completions", body, timeout=120)
    time.sleep(1)  # vLLM's counters follow the reply
    before = metrics_now()
    status, reply = request("/v1/completions", body, timeout=120)
    time.sleep(1)
    after = metrics_now()
    usage = json.loads(reply).get("usage", {}) if status == 200 else {}
    start.probe = {
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "hits_second_send": metrics.delta(before, after, metrics.PREFIX_HITS) or 0,
        "drafts": metrics.total(after, metrics.DRAFTS),
        "draft_tokens": metrics.total(after, metrics.DRAFT_TOKENS),
        "accepted_tokens": metrics.total(after, metrics.ACCEPTED),
    }
    print(f"  {case}: prefix probe {start.probe}", flush=True)


def predict(case: str, env: dict[str, str], start: Start) -> None:
    """`sparkserve plan` for the KV memory vLLM logged, with the case's layout: the pool and
    hit unit it predicts, beside the logged pool (parse_log)."""
    if start.kv_gib is None:
        return
    kv_bytes = str(int(start.kv_gib * 2**30))
    command = [sys.executable, "-m", "sparkserve", "plan", "--model", env["MODEL"],
               "--drafter", env["DRAFT_MODEL"], "--weights-gib", "1", "--drafter-weights-gib",
               "1", "--kv-cache-memory-bytes", kv_bytes, "--json"]  # fmt: skip
    if case in STOCK_LAYOUT:
        command += ["--stock-layout"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    try:
        kv = json.loads(done.stdout)["kv"] or {}
    except (json.JSONDecodeError, KeyError):
        print(f"  {case}: plan failed: {done.stderr[-400:]}", flush=True)
        return
    start.predicted = {k: kv.get(k) for k in ("pool_tokens", "hit_unit", "scheduler_block",
                                              "hash_block")}  # fmt: skip
    print(f"  {case}: predicted {start.predicted}, logged {start.kv_tokens}", flush=True)


def gpu_memory_mib() -> dict[str, int]:
    """The GPU's memory in MiB as nvidia-smi reports it: total, used and free (all processes)."""
    names = ("total", "used", "free")
    query = [
        "nvidia-smi", f"--query-gpu={','.join(f'memory.{n}' for n in names)}",
        "--format=csv,noheader,nounits", "--id=0",
    ]  # fmt: skip
    done = subprocess.run(query, capture_output=True, text=True, check=True)
    return dict(zip(names, (int(v) for v in done.stdout.split(",")), strict=True))


def stop_at_load(case: str, process: subprocess.Popen, log_path: Path, start: Start,
                 deadline: float) -> None:  # fmt: skip
    """SIGTERM the launcher once the engine core logs; time its exit (SIGKILL after the grace)."""
    began = time.monotonic()
    while process.poll() is None and time.monotonic() < deadline - STOP_GRACE_S:
        if ENGINE_STARTED in log_path.read_text(errors="replace"):
            break
        time.sleep(0.2)
    start.stopped_after_s = round(time.monotonic() - began, 1)
    stopping = time.monotonic()
    process.send_signal(signal.SIGTERM)
    while process.poll() is None and time.monotonic() - stopping < STOP_GRACE_S:
        if start.healthy_s is None and request("/health", timeout=1)[0] == 200:
            start.healthy_s = round(time.monotonic() - began, 1)  # it came up after the stop
        time.sleep(0.5)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    start.stop_exit = process.wait()
    start.stop_s = round(time.monotonic() - stopping, 1)
    time.sleep(2)  # the driver frees a killed process's memory shortly after it is reaped
    start.gpu_used_mib_after = gpu_memory_mib()["used"]
    print(
        f"  {case}: SIGTERM after {start.stopped_after_s} s, exit {start.stop_exit} in "
        f"{start.stop_s} s, GPU memory used after: {start.gpu_used_mib_after} MiB",
        flush=True,
    )


def serve_then_stop(case: str, process: subprocess.Popen, start: Start, deadline: float) -> None:
    """Wait until healthy, ask for one completion, then stop the whole group with SIGTERM."""
    began = time.monotonic()
    while process.poll() is None and time.monotonic() < deadline - 30:
        if request("/health", timeout=2)[0] == 200:
            start.healthy_s = round(time.monotonic() - began, 1)
            start.gpu_memory_healthy = gpu_memory_mib()
            break
        print(f"  {case}: {time.monotonic() - began:4.0f} s, not healthy yet", flush=True)
        time.sleep(5)
    if start.healthy_s is not None:
        status, body = request("/v1/completions", {
            "model": "spark-geometry", "prompt": "The cache keeps", "max_tokens": 32,
            "temperature": 0}, timeout=60)  # fmt: skip
        start.completion = f"HTTP {status}: {body[:160]}"
        start.gpu_memory_served = gpu_memory_mib()
        print(f"  {case}: GPU memory (MiB) once healthy {start.gpu_memory_healthy}, after "
              f"one completion {start.gpu_memory_served}", flush=True)  # fmt: skip
        if case in PREFIX_PROBE:
            prefix_probe(case, start)
    stopping = time.monotonic()
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        start.stop_exit = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        start.stop_exit = process.wait()
    start.stop_s = round(time.monotonic() - stopping, 1)


def run_case(case: str, models: tuple[Path, Path], work: Path, out: Path, deadline: float,
             budget_s: float) -> Start:  # fmt: skip
    volume = work / f"volume-{CASES[case][0]}"
    start = Start(case=case, volume=volume.name)
    if time.monotonic() + budget_s > deadline:
        start.skipped = f"not started: under {budget_s:.0f} s left before the deadline"
        return start
    if CASES[case][1]:
        shutil.rmtree(volume, ignore_errors=True)
    volume.mkdir(parents=True, exist_ok=True)
    home = work / f"home-{case}"  # a new container's own layer
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    tmp_before = set(os.listdir("/tmp"))
    before = inventory(volume)
    log_path = out / f"{case}.log"
    if STOP_AT_LOAD.get(case) is False:
        patch_startup_stop("--revert")
    env = launcher_env(case, models, volume, home)
    if case in STOCK_LAYOUT:
        patch_page_divide("--revert")
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [str(REPO / "serve.sh")], env=env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        if case in STOP_AT_LOAD:
            try:
                stop_at_load(case, process, log_path, start, deadline)
            finally:
                if not STOP_AT_LOAD[case]:
                    patch_startup_stop()
        else:
            try:
                serve_then_stop(case, process, start, deadline)
            finally:
                if case in STOCK_LAYOUT:
                    patch_page_divide()
    parse_log(log_path.read_text(errors="replace"), start)
    if case in PREFIX_PROBE:
        predict(case, env, start)
    after = inventory(volume)
    for name, files in after.items():
        start.volume_files[name] = [len(files), sum(files.values())]
        start.new_files[name] = len(set(files) - set(before[name]))
    start.outside = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_dir())[:40]
    start.outside += [f"/tmp/{n}" for n in sorted(set(os.listdir("/tmp")) - tmp_before)]
    return start


def table(starts: list[Start]) -> str:
    rows = ["| case | volume | healthy s | KV GiB | KV tokens | GPU free MiB | new files in "
            "caches | left outside the volume | stop |", "| --- " * 9 + "|"]  # fmt: skip
    for s in starts:
        if s.skipped:
            rows.append(f"| {s.case} | {s.volume} | {s.skipped} ||||||||")
            continue
        new = ", ".join(f"{k} {v}" for k, v in s.new_files.items() if v) or "none"
        rows.append(
            f"| {s.case} | {s.volume} | {s.healthy_s} | {s.kv_gib} | {s.kv_tokens} | "
            f"{s.gpu_memory_healthy.get('free')} | {new} | "
            f"{', '.join(s.outside) or 'nothing'} | exit {s.stop_exit} in {s.stop_s} s |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--cases",
        default="cold,recreated",
        help=f"comma-separated, in order, from {', '.join(CASES)}",
    )
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--deadline-s", type=float, default=560)
    parser.add_argument(
        "--case-budget-s", type=float, default=200, help="the least time a case needs to be started"
    )
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.deadline_s
    cases = args.cases.split(",")
    if bad := [c for c in cases if c not in CASES]:
        parser.error(f"--cases: {bad[0]!r} is not one of {', '.join(CASES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    written = write_models(args.work / "models", RECIPE.name, args.layers)
    assert written.drafter is not None  # the default recipe serves with DFlash
    models = (written.target, written.drafter)
    starts = []
    for case in cases:
        print(f"case {case}", flush=True)
        starts.append(run_case(case, models, args.work, args.out, deadline, args.case_budget_s))
        (args.out / "starts.json").write_text(json.dumps([asdict(s) for s in starts], indent=1))
    print(table(starts))
    for s in starts:
        if s.probe or s.predicted:
            print(f"{s.case}: probe {s.probe}; KV tokens logged {s.kv_tokens}, "
                  f"predicted {s.predicted}")  # fmt: skip
    failed = [s.case for s in starts if not s.skipped and s.healthy_s is None]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
