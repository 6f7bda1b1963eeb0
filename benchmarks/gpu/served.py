"""What the GPU benchmarks (decode_speed.py, spec_cost.py) share: a selftest case's server
started and stopped around a measurement, concurrent streams of random prompts sent to it,
the GPU's name, option lists and the JSON record."""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from sparkserve.selftest import cases

FIRST_ID = 16  # random prompt ids from here up: past the special and parser tokens
# the knobs a record keeps of a server's environment
KNOBS = ("MAX_NUM_SEQS", "MAX_BATCHED_TOKENS", "GPU_MEM", "PREFIX_CACHE", "NUM_SPEC_TOKENS",
         "SPARK_KEEP_BF16_LMHEAD", "LOAD_FORMAT", "EXTRA_ARGS", "RECIPE",
         "MAX_MODEL_LEN")  # fmt: skip


def ints(text: str, option: str, low: int, high: int) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{option} {text!r}: comma-separated integers") from None
    if not values or any(not low <= v <= high for v in values):
        raise argparse.ArgumentTypeError(f"{option} {text!r}: each from {low} to {high}")
    return values


def names(text: str, option: str, allowed: Iterable[str]) -> tuple[str, ...]:
    """A comma-separated choice among `allowed`, in the order given."""
    chosen = tuple(v for v in text.split(",") if v)
    if not chosen or any(v not in allowed for v in chosen):
        raise argparse.ArgumentTypeError(f"{option} {text!r}: one or more of {','.join(allowed)}")
    return chosen


def settings(env: Mapping[str, str]) -> dict[str, str]:
    return {k: env[k] for k in KNOBS if k in env}


def write_json(path: Path, record: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")


def gpu_name() -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return done.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown GPU"


def random_ids(count: int, vocab: int, rng: random.Random) -> list[int]:
    return [rng.randrange(FIRST_ID, vocab) for _ in range(count)]


def run_streams(
    stream: Callable[[list[int], int], Any], count: int, gen: int, vocab: int,
    rng: random.Random, prompt_tokens: int,
) -> list[Any]:  # fmt: skip
    """`count` streams at once, each its own random prompt; their results."""
    results: list[Any] = [None] * count
    prompts = [random_ids(prompt_tokens, vocab, rng) for _ in range(count)]

    def one(i: int) -> None:
        results[i] = stream(prompts[i], gen)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def save_figure(figure: Any, path: Path, title: str) -> None:
    """A benchmark's matplotlib figure with its title, as a PNG at `path`."""
    import matplotlib.pyplot as plt

    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


@contextlib.contextmanager
def case_server(
    case: cases.Case, env: Mapping[str, str], log: Path, timeout_s: float,
    progress: Callable[[str], None],
) -> Iterator[cases.Running]:  # fmt: skip
    """The case's launcher started with `env`, healthy (else RuntimeError naming why), and
    killed on the way out."""
    running = cases.start(case, env, log)
    try:
        up = cases.wait_healthy(running, timeout_s, progress)
        if not up.ok:
            raise RuntimeError(f"{case.name}: {up.detail}")
        progress(f"{case.name}: healthy {up.detail}")
        yield running
    finally:
        cases.kill(running)
