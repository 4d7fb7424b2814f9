"""The package's face: a light import, a complete public API, sizes that stay readable."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import labkit as lk
from tests.ast_parse import parse

ROOT = Path(__file__).resolve().parents[1]
INTRO = "Introduced in"


def test_import_labkit_is_light():
    code = (
        "import sys, json, labkit; "
        "print(json.dumps(sorted(m for m in ('torch', 'matplotlib', 'papermill', 'ipywidgets',"
        " 'numpy') if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert json.loads(out.stdout) == []


def test_public_api_resolves():
    for name in lk.__all__:
        assert getattr(lk, name) is not None, name


def test_modules_stay_short():
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "labkit").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, f"split these by concept: {long}"


def _intro_problems() -> dict[str, list[str]]:
    """Per module: where INTRO stands other than once in the module docstring."""
    found = {}
    for path in sorted((ROOT / "labkit").rglob("*.py")):
        tree = parse(path.read_text())
        where = []
        if (ast.get_docstring(tree) or "").count(INTRO) > 1:
            where.append("module docstring (more than once)")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if INTRO in (ast.get_docstring(node) or ""):
                    where.append(f"{node.name} (line {node.lineno})")
        if where:
            found[str(path.relative_to(ROOT))] = where
    return found


def test_notebook_named_once_per_module():
    """STYLE.md: the module docstring names the notebook that introduces it, not every function."""
    problems = _intro_problems()
    assert not problems, f"say '{INTRO} notebooks/...' once, in the module docstring: {problems}"
