"""Run a function right after a given module has been imported."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

log = logging.getLogger("vllm.sparkserve_cpu_shims")

_pending: dict[str, list[Callable[[ModuleType], None]]] = {}


class _Loader(importlib.abc.Loader):
    """Wraps a module's real loader and runs the pending callbacks after exec."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        for fn in _pending.pop(module.__name__, []):
            fn(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)  # type: ignore[arg-type]
                return spec
        return None


_finder = _Finder()


def after_import(name: str, fn: Callable[[ModuleType], None]) -> None:
    """Call ``fn(module)`` once ``name`` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        fn(module)
        return
    _pending.setdefault(name, []).append(fn)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
