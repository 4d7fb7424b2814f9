"""The ``labkit`` package has no import cycles: a module never imports one that imports it back.

The graph is built from the sources with ``ast``. An edge A -> B means file A imports module B
(a package counts as its ``__init__.py``; ``from pkg import name`` counts ``pkg.name`` when that
is a module). Two graphs are checked: module-level imports only (what runs at import time, where
a cycle breaks with a partly initialised module), and every import, function bodies included
(a deferred import hides a cycle rather than removing it). Edges into the root package's
``__init__`` are left out: any module may import ``labkit`` for its namespace.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.ast_parse import parse

ROOT = Path(__file__).resolve().parents[1] / "labkit"


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under ``root``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(tree: ast.Module, module: str, is_pkg: bool, deep: bool) -> list[str]:
    """Absolute names imported in ``tree``; module level only unless ``deep``."""
    nodes = ast.walk(tree) if deep else _top_level(tree.body)
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_pkg else module.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    return names


def _top_level(body: list[ast.stmt]):
    """Statements that run at import time: not inside a def or a class body's methods."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from _top_level(getattr(node, field, []) or [])


def import_graph(root: Path, deep: bool) -> dict[str, set[str]]:
    """Edges module -> modules of the same package it imports.

    Args:
        root: the package folder.
        deep: also count imports inside functions.

    Returns:
        The adjacency sets.
    """
    files = _modules(root)
    pkg = root.name

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        tree = parse(path.read_text(encoding="utf-8"), str(path))
        for name in _imports(tree, mod, path.name == "__init__.py", deep):
            if name == pkg or name.startswith(pkg + "."):
                target = resolve(name)
                if target and target not in (mod, pkg):
                    edges[mod].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan's algorithm, iterative).

    Args:
        edges: the import graph.

    Returns:
        Each cycle's modules, sorted; the list sorted.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


@pytest.mark.parametrize("deep", [False, True], ids=["module-level", "with-function-imports"])
def test_labkit_has_no_import_cycles(deep: bool) -> None:
    found = cycles(import_graph(ROOT, deep))
    assert not found, "import cycle(s) in labkit: " + "; ".join(" <-> ".join(c) for c in found)


def test_a_planted_cycle_is_named(tmp_path: Path) -> None:
    pkg = tmp_path / "labkit"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from labkit.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n")
    (pkg / "c.py").write_text("import labkit.a\n")
    (pkg / "d.py").write_text("import labkit\nimport labkit.c\n")  # no cycle through the root
    assert cycles(import_graph(pkg, deep=False)) == []  # b's import is inside a function
    assert cycles(import_graph(pkg, deep=True)) == [["labkit.a", "labkit.c", "labkit.sub.b"]]
