"""The places in vLLM that the code and docs cite, by function rather than by line (lines move
with every release): each cited name is in the text that cites it, and exists in the release
under test (marker `release`: the pinned one, then the next)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PORTS = [
    ("distributed/parallel_state.py", "init_distributed_environment"),
    ("config/parallel.py", "ParallelConfig.master_port"),
    ("distributed/device_communicators/shm_broadcast.py", "MessageQueue.__init__"),
    ("v1/executor/multiproc_executor.py", "MultiprocExecutor._init_executor"),
    ("v1/executor/multiproc_executor.py", "WorkerProc._init_message_queues"),
]
CITATIONS: dict[str, list[tuple[str, str]]] = {
    "src/sparkserve/launch/vllm_command.py": [
        ("engine/arg_utils.py", "EngineArgs.add_cli_args"),
        ("entrypoints/common/cli_args.py", "make_arg_parser"),
    ],
    "src/sparkserve/cluster/preflight.py": PORTS,
    "docs/CLUSTER.md": [*PORTS, ("engine/arg_utils.py", "EngineArgs.add_cli_args")],
    "src/sparkserve/memory/kv.py": [
        ("v1/engine/core.py", "EngineCore._initialize_kv_caches"),
        ("platforms/cpu.py", "CpuPlatform.check_and_update_config"),
        ("platforms/interface.py", "Platform._align_hybrid_block_size"),
    ],
}


def vllm_root() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def defines(source: str, qualified: str) -> bool:
    """Whether the module defines `qualified`: a function or class, a method, or a class's
    annotated or assigned attribute."""
    scope: list[ast.stmt] = ast.parse(source).body
    *outer, last = qualified.split(".")
    for name in outer:
        found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == name]
        if not found:
            return False
        scope = found[0].body
    names: set[str] = set()
    for node in scope:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return last in names


CASES = [(citer, path, name) for citer, cited in CITATIONS.items() for path, name in cited]


@pytest.mark.release
@pytest.mark.parametrize(("citer", "path", "name"), CASES)
def test_each_cited_vllm_function_exists_in_the_release(citer: str, path: str, name: str) -> None:
    text = " ".join((REPO / citer).read_text().split())
    assert f"`{name}`" in text, f"{citer} no longer cites `{name}`: update CITATIONS"
    assert path in text, f"{citer} no longer names {path}: update CITATIONS"
    source = vllm_root() / path
    assert source.is_file(), f"{citer}: vLLM has no {path}"
    assert defines(source.read_text(), name), f"{citer}: {path} defines no {name}"


def test_the_check_tells_a_missing_name_from_a_present_one() -> None:
    source = "class A:\n    port: int = 1\n    def run(self):\n        pass\ndef f():\n    pass\n"
    assert defines(source, "A.port") and defines(source, "A.run") and defines(source, "f")
    assert not defines(source, "A.walk") and not defines(source, "B.run")
    assert not defines(source, "g")
