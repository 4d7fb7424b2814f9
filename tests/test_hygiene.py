"""Committed notebooks are clean and follow the course's conventions (DESIGN.md, STYLE.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from labkit import nbhygiene

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REQUIRED_PARAMETERS = {"world_size", "backend", "device", "fast", "seed"}
PARAM_LINE = re.compile(r"^(?P<name>\w+): (?P<type>[\w\[\], |]+) = (?P<value>.+?)  # \S.*$")


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def source(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_outputs_except_checked_cells(path):
    assert nbhygiene.problems(load(path)) == [], (
        f"run: python -m labkit.nbhygiene strip {path.relative_to(ROOT)}"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_conventions(path):
    assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name)
    nb = load(path)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    cells = nb["cells"]
    title = source(cells[0])
    assert cells[0]["cell_type"] == "markdown" and title.startswith(f"# {path.name[:2]}")
    learn = title.split("You will learn", 1)
    assert len(learn) == 2, "the first cell lists what the learner will learn"
    bullets = [
        ln
        for ln in learn[1].split("Prerequisites")[0].splitlines()
        if ln.lstrip().startswith(("- ", "* "))
    ]
    assert len(bullets) == 3, f"'You will learn' has {len(bullets)} bullets, not 3"
    assert "Prerequisites" in title
    assert cells[1]["cell_type"] == "code" and "import labkit as lk" in source(cells[1])
    params = cells[2]
    assert "parameters" in params.get("metadata", {}).get("tags", []), "cell 3 is the parameters"
    names = set()
    for line in source(params).splitlines():
        if line.strip() and not line.startswith("#"):
            m = PARAM_LINE.match(line)
            assert m, f"parameter line is not 'name: type = value  # help': {line!r}"
            names.add(m["name"])
    assert REQUIRED_PARAMETERS <= names, f"missing parameters {REQUIRED_PARAMETERS - names}"
    code = "\n".join(source(c) for c in cells if c["cell_type"] == "code")
    assert "lk.exercises.check(" in code, "every notebook has an automatically checked exercise"
    assert "NotImplementedError" in code, "the exercise leaves the learner's function to write"
    assert "lk.record(" in code, "key numbers are recorded for the course report"
    assert re.search(r"^\s*assert ", code, re.M), "claims are checked by asserts"
    assert "Summary" in source(cells[-1]), "the notebook ends with a summary"
    assert "from labkit" not in code and "import *" not in code, "notebooks write lk.<name>"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_readme_course_map_lists_the_notebook(path):
    assert path.name in (ROOT / "README.md").read_text()


def test_strip_keeps_only_checked_outputs():
    nb = {
        "metadata": {"papermill": {"duration": 1}},
        "cells": [
            {
                "cell_type": "code",
                "source": "print(1)",
                "execution_count": 3,
                "outputs": [{"output_type": "stream", "name": "stdout", "text": "1\n"}],
                "metadata": {"papermill": {}},
            },
            {
                "cell_type": "code",
                "source": "# NBVAL_CHECK_OUTPUT\nprint(2)",
                "execution_count": 4,
                "outputs": [
                    {
                        "output_type": "execute_result",
                        "execution_count": 4,
                        "data": {"text/plain": "2"},
                        "metadata": {},
                    }
                ],
                "metadata": {},
            },
        ],
    }
    assert len(nbhygiene.problems(nb)) == 3
    clean = nbhygiene.strip(nb)
    assert nbhygiene.problems(clean) == []
    assert clean["cells"][0]["outputs"] == [] and clean["cells"][1]["outputs"]
    assert clean["cells"][0]["execution_count"] is None
    # nbval needs a count on a cell with a reference output: the first checked cell is 1.
    assert clean["cells"][1]["execution_count"] == 1
    assert clean["cells"][1]["outputs"][0]["execution_count"] == 1
    marked_empty = {
        "cells": [
            {
                "cell_type": "code",
                "source": "# NBVAL_CHECK_OUTPUT",
                "outputs": [],
                "execution_count": None,
            }
        ],
        "metadata": {},
    }
    assert nbhygiene.problems(marked_empty) == [
        "cell 0: marked NBVAL_CHECK_OUTPUT but has no committed output to check"
    ]
