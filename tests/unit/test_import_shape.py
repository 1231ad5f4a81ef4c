"""The shape of the package, read from every import in ``daskrl/`` with ``ast``: those at
module level, inside functions and under ``TYPE_CHECKING``, plus the modules a package's
``_LAZY`` map or an ``importlib.import_module("daskrl...")`` or ``__import__("daskrl...")``
call names.

- no two packages import each other;
- ``store/`` imports neither ``data/``, ``integrations/`` nor ``collect/``;
- ``store/_format/`` imports only itself, ``daskrl.errors`` and private leaf helpers
  (``daskrl._*`` modules);
- ``data/`` reaches the store only through ``daskrl.store``'s exports;
- no cycle of modules, among the imports run at import time or among all imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "daskrl"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _known(name: str) -> str | None:
    """The longest module of daskrl that ``name`` names or lies in."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in MODULES:
            return ".".join(parts[:i])
    return None


def _imports(module: str, source: str | None = None) -> list[tuple[str, bool]]:
    """``(imported module, at import time)`` for every import of ``module`` into daskrl
    (``source``: its text, read from its file unless given)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def add(name: str, eager: bool) -> None:
        target = _known(name)
        if target is not None and target != module:
            found.append((target, eager))

    def visit(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            now = eager and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                   ast.Lambda))
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                now = False
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, now)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    head = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join([*head, base] if base else head)
                for alias in child.names:  # a name may be a submodule
                    full = f"{base}.{alias.name}"
                    add(full if full in MODULES else base, now)
            elif isinstance(child, ast.Call) and ast.unparse(child.func).endswith(
                    ("import_module", "__import__")) and child.args and isinstance(
                    child.args[0], ast.Constant):
                add(str(child.args[0].value), False)
            elif isinstance(child, ast.Assign) and isinstance(child.value, ast.Dict) and any(
                    isinstance(t, ast.Name) and t.id == "_LAZY" for t in child.targets):
                for value in child.value.values:
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        name = value.value
                        add(name if name.startswith("daskrl") else f"{module}.{name}", False)
            visit(child, now)

    visit(ast.parse(path.read_text() if source is None else source), True)
    return found


IMPORTS = {m: _imports(m) for m in MODULES}


def _package(module: str) -> str:
    """``daskrl.store._format.read`` -> ``store``; a top-level module is its own package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "daskrl"


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def _uses(source: str, target: str) -> list[str]:
    """``module -> module`` imports from package ``source`` into package ``target``."""
    return sorted(f"{m} -> {t}" for m, found in IMPORTS.items() for t, _ in found
                  if _package(m) == source and _package(t) == target)


WALKED = """
from typing import TYPE_CHECKING
import importlib

from daskrl.store._layout import run_of
from . import _url

if TYPE_CHECKING:
    from daskrl.store._store import TrajectoryStore

_LAZY = {"open_store": "_store", "BatchHandle": "daskrl.store._handles"}


def later():
    from daskrl.store._writing import Writer
    importlib.import_module("daskrl.store._reading")
    __import__("daskrl.store._commits")
"""


def test_the_walk_sees_the_imports_of_every_kind():
    # Module-level, TYPE_CHECKING, function-level, lazy-map and by-name imports, as the rules
    # below depend on each kind being seen.
    assert sorted(_imports("daskrl.store", WALKED)) == [
        ("daskrl.store._commits", False), ("daskrl.store._handles", False),
        ("daskrl.store._layout", True), ("daskrl.store._reading", False),
        ("daskrl.store._store", False), ("daskrl.store._store", False),
        ("daskrl.store._url", True), ("daskrl.store._writing", False)]
    assert ("daskrl.store", True) in IMPORTS["daskrl.data._transitions"]
    assert ("daskrl.data._episodes", False) in IMPORTS["daskrl.data"]
    assert ("daskrl.data._inspect", False) in IMPORTS["daskrl.cli._store"]
    assert len(MODULES) > 100


def test_no_two_packages_import_each_other():
    packages = {_package(m) for m in MODULES} - {"daskrl"}  # the root is the facade
    pairs = [(a, b) for a in sorted(packages) for b in sorted(packages)
             if a < b and _uses(a, b) and _uses(b, a)]
    assert not pairs, {f"{a} <-> {b}": (_uses(a, b)[:3], _uses(b, a)[:3]) for a, b in pairs}


@pytest.mark.parametrize("above", ["data", "integrations", "collect"])
def test_the_store_imports_nothing_above_it(above):
    assert not _uses("store", above)


def test_the_format_layer_imports_only_itself_errors_and_private_leaves():
    allowed = [t for m, found in IMPORTS.items() if m.startswith("daskrl.store._format")
               for t, _ in found
               if not (t.startswith("daskrl.store._format") or t == "daskrl.errors"
                       or (t.count(".") == 1 and t.split(".")[1].startswith("_")))]
    assert not allowed


def test_the_readers_use_only_the_stores_exports():
    reaches = sorted(f"{m} -> {t}" for m, found in IMPORTS.items() if _package(m) == "data"
                     for t, _ in found if t.startswith("daskrl.store.") or
                     (_package(t) == "store" and t != "daskrl.store"))
    assert not reaches


def _private_members(module: str, classes: set[str]) -> set[str]:
    """Private names ``classes`` of ``module`` define: methods and ``self._x`` attributes."""
    out = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for sub in ast.walk(node):
                name = getattr(sub, "name", None) if isinstance(
                    sub, (ast.FunctionDef, ast.AsyncFunctionDef)) else (
                    sub.attr if isinstance(sub, ast.Attribute) else None)
                if name and name.startswith("_") and not name.startswith("__"):
                    out.add(name)
    return out


def test_the_readers_reach_no_private_member_of_the_store_or_its_handles():
    private = (_private_members("daskrl.store._store", {"TrajectoryStore"})
               | _private_members("daskrl.store._batch_handle", {"BatchHandle"}))
    assert {"_reader", "_index", "_store_object"} <= private
    import daskrl.store

    exported = set(daskrl.store.__all__)
    reaches = []
    for module in (m for m in MODULES if _package(m) == "data"):
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                reaches.append(f"{module}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module == "daskrl.store":
                reaches += [f"{module}:{node.lineno} {a.name}" for a in node.names
                            if a.name not in exported]
    assert not reaches


def test_no_module_level_cycle():
    eager = {m: {t for t, now in found if now} for m, found in IMPORTS.items()}
    assert not _cycles(eager)
    every = {m: {t for t, _ in found} for m, found in IMPORTS.items()}
    assert not _cycles(every)
