"""Every sparkserve name a test uses exists, checked without running the test.

CI has no GPU, so the bodies of the GPU tests (tests/in_vllm/lmhead) are skipped there and a
function that moved is found only on a GPU. This reads every test module's source: the names
imported from sparkserve (at the top or inside a function) and the attributes read from an
imported sparkserve module (`int8_kernel.launch(...)`) must all exist in the package.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
PACKAGE = "sparkserve"


def suite_modules() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py") if "cpu_shims" not in path.parts)


def uses(tree: ast.AST) -> Iterator[tuple[int, str, str]]:
    """(line, module, name) for each sparkserve name the source imports or reads."""
    modules: dict[str, str] = {}  # local name -> sparkserve module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
            for alias in node.names:
                yield node.lineno, node.module or "", alias.name
                submodule = f"{node.module}.{alias.name}"
                if importlib.util.find_spec(node.module or "") and _is_module(submodule):
                    modules[alias.asname or alias.name] = submodule
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE) and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            yield node.lineno, modules[node.value.id], node.attr


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("path", suite_modules(), ids=lambda p: str(p.relative_to(TESTS)))
def test_every_sparkserve_name_a_test_uses_exists(path: Path) -> None:
    missing = []
    for line, module, name in uses(ast.parse(path.read_text(), str(path))):
        if name == "*" or _is_module(f"{module}.{name}"):
            continue
        if not hasattr(importlib.import_module(module), name):
            missing.append(f"{path.name}:{line}: {module}.{name}")
    assert not missing, "names that do not exist: " + ", ".join(missing)
