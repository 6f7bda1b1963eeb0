"""The package's import graph, read from the source (every import, at the top or inside a
function): no module imports itself back through others, and no package does either, so that
a subpackage never reaches up to a module that depends on it; and no tool (a command a user
runs to judge or load a server) uses another tool as its library: what two tools share lives
in a package below both (client/, server/, output/)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "sparkserve"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules `path` imports (`from a import b` counts b when b is a module)."""
    found: set[str] = set()
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            named = {f"{base}.{alias.name}" for alias in node.names}
            found |= named
            if not named <= modules:  # a name from the module itself, not only its modules
                found.add(base)
    return {name for name in found if name in modules and name != here}


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in (SRC / PACKAGE).rglob("*.py")}
    modules = set(paths)
    return {name: imports_of(path, modules) for name, path in paths.items()}


def unit(module: str) -> str:
    """The top-level piece a module belongs to: a root module, or a subpackage."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_module_imports_itself_back() -> None:
    edges = graph()
    assert len(edges) > 50, "the package's modules were found"
    assert cycle(edges) is None


def test_no_package_imports_itself_back() -> None:
    """Between root modules and subpackages: a package's own `__init__` may import its
    modules (that edge stays inside the unit)."""
    units: dict[str, set[str]] = {}
    for module, targets in graph().items():
        mine = unit(module)
        units.setdefault(mine, set()).update(unit(t) for t in targets if unit(t) != mine)
    assert cycle(units) is None


# The tools: each is a command; none imports another.
TOOL_NAMES = ("bench", "doctor", "plan", "selftest", "stress", "tune", "verify")
TOOLS = frozenset(f"{PACKAGE}.{name}" for name in TOOL_NAMES)


def tool_imports(edges: dict[str, set[str]]) -> list[str]:
    """Each import of one tool's module by another tool's module, as "a -> b"."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        for target in targets
        if unit(module) in TOOLS and unit(target) in TOOLS and unit(module) != unit(target)
    )


def test_no_tool_imports_another_tool() -> None:
    """tune runs the stress command through the CLI's own parser (sparkserve.cli), as a user
    types it: that is the command, not stress's functions, and the root is no tool."""
    assert tool_imports(graph()) == []


def test_the_layering_rule_finds_a_tool_importing_a_tool() -> None:
    edges = {
        f"{PACKAGE}.verify.cli": {f"{PACKAGE}.tune.restarts", f"{PACKAGE}.client.checks"},
        f"{PACKAGE}.tune.restarts": set(),
        f"{PACKAGE}.client.checks": set(),
    }
    assert tool_imports(edges) == [f"{PACKAGE}.verify.cli -> {PACKAGE}.tune.restarts"]


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": {"b"}}, ["b", "c", "b"]),
    ],
)
def test_the_cycle_finder_finds_cycles(edges: dict[str, set[str]], expected: list[str]) -> None:
    assert cycle(edges) == expected


def test_no_test_module_imports_one_of_another_folder() -> None:
    """Test modules in other folders share code through tests/support: pytest puts a test's
    own folder on sys.path as it collects it, so `from test_x import ...` from another folder
    works or fails by the order the folders were collected in (it failed in CI: e2e is
    collected before image). A module of the same folder is always there."""
    tests = SRC.parent / "tests"
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            found += [
                f"{path.relative_to(tests)}: {name}"
                for name in names
                if name.startswith("test_") and not (path.parent / f"{name}.py").is_file()
            ]
    assert found == []
