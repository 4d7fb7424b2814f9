"""Every course notebook runs headlessly with ``fast=True``, once.

    .venv/bin/python -m pytest tests/test_notebooks.py -m notebooks

Notebooks with cells marked ``# NBVAL_CHECK_OUTPUT`` run under nbval (``tests/conftest.py``
collects them here, with ``fast = True`` set in their parameters cell) so that the marked
outputs are compared too; the others run through labkit's course runner (papermill), as
``labkit course run --fast`` runs them. The last tests check that split and that collection.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit.course import run_notebook
from tests.conftest import NBVAL_CELL_TIMEOUT_S, NBVAL_PARAMETERS, checks_output, with_parameters

ROOT = Path(__file__).resolve().parents[1]
ALL_NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FIXTURES = Path(__file__).resolve().parent / "notebooks"
# The rest run under nbval (tests/conftest.py), also with fast=True.
NOTEBOOKS = [p for p in ALL_NOTEBOOKS if not checks_output(p)]
# Well under pytest's timeout (pyproject.toml), so that a cell that never ends fails with the
# runner's message instead of being killed; as nbval's (tests/conftest.py).
NOTEBOOK_CELL_TIMEOUT_S = NBVAL_CELL_TIMEOUT_S


@pytest.mark.notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_fast(path: Path, tmp_path: Path) -> None:
    result = run_notebook(path, tmp_path, {"fast": True}, cell_timeout=NOTEBOOK_CELL_TIMEOUT_S)
    if not result.ok:
        err = result.error
        where = f"cell {err.cell_index + 1}" if err and err.cell_index is not None else "?"
        pytest.fail(
            f"{path.name} failed in {where} after {result.seconds:.1f} s "
            f"(executed copy: {result.output_path})\n"
            f"--- failing cell ---\n{result.failing_cell}\n"
            f"--- error ---\n{err.ename if err else ''}: {err.evalue if err else ''}\n"
            f"{err.traceback if err else ''}",
            pytrace=False,
        )


# Executed in Chinese in every run (the whole Chinese course: `labkit course run --fast --lang
# zh-CN`); two short notebooks, each with an exercise whose verdict must come out in Chinese.
ZH_SAMPLE = ("15", "16")


@pytest.mark.notebooks
@pytest.mark.parametrize("number", ZH_SAMPLE)
def test_chinese_notebook_runs_fast(number: str, tmp_path: Path, monkeypatch) -> None:
    (path,) = (ROOT / "notebooks" / "zh-CN").glob(f"{number}_*.ipynb")
    monkeypatch.setenv("LABKIT_LANG", "zh-CN")  # as `labkit course run --lang zh-CN` sets it
    result = run_notebook(path, tmp_path, {"fast": True}, cell_timeout=NOTEBOOK_CELL_TIMEOUT_S)
    err = result.error
    assert result.ok, f"zh-CN/{path.name}: {err.ename if err else ''}: {err.evalue if err else ''}"
    outputs = "".join(
        "".join(o.get("text", "")) if o.get("output_type") == "stream" else ""
        for c in nbformat.read(result.output_path, as_version=4).cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )
    assert "尚未作答——参考答案通过了这项检查" in outputs, "the exercise verdict is not in Chinese"


def _collected(*args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return [line for line in proc.stdout.splitlines() if ".ipynb::" in line]


@pytest.mark.slow  # two pytest subprocesses
def test_nbval_collects_only_notebooks_with_checked_cells() -> None:
    ids = _collected("tests/test_notebooks.py")
    files = {line.split("::")[0] for line in ids}
    assert "tests/notebooks/checked_output.ipynb" in files, ids
    assert checks_output(FIXTURES / "checked_output.ipynb")
    for unmarked in ("ok.ipynb", "broken.ipynb", "noparams.ipynb", "slow.ipynb"):
        assert not checks_output(FIXTURES / unmarked)
        assert f"tests/notebooks/{unmarked}" not in files
    for path in ALL_NOTEBOOKS:  # each notebook runs once: under nbval or through papermill
        assert (path.relative_to(ROOT).as_posix() in files) == checks_output(path)
        assert (path in NOTEBOOKS) != checks_output(path)
    # One item per code cell, named as nbval names them.
    assert [i for i in ids if i.startswith("tests/notebooks/checked_output.ipynb")] == [
        f"tests/notebooks/checked_output.ipynb::Cell {n}" for n in range(4)
    ]
    quick = _collected("tests/test_notebooks.py", "-m", "not notebooks")
    assert quick == []


def test_nbval_runs_notebooks_with_fast_parameters() -> None:
    source = "world_size: int = 4  # ranks\nfast: bool = False  # shrink sizes\nseed: int = 0\n"
    got = with_parameters(source, NBVAL_PARAMETERS)
    assert got.startswith(source.rstrip("\n"))
    assert got.endswith("fast = True  # set by the test suite")
    namespace: dict = {}
    exec(got, namespace)
    assert namespace["fast"] is True and namespace["world_size"] == 4
    # A notebook that does not declare a parameter does not get it.
    assert with_parameters("seed: int = 0", NBVAL_PARAMETERS) == "seed: int = 0"
    assert with_parameters("fastest = 1", NBVAL_PARAMETERS) == "fastest = 1"
