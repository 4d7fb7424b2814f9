"""Test-suite configuration: nbval over the notebooks whose committed outputs are the lesson.

A plain ``pytest`` (``testpaths = ["tests"]``) collects, next to ``tests/test_notebooks.py``,
nbval items for every notebook in ``notebooks/`` and ``tests/notebooks/`` that has at least
one cell marked ``# NBVAL_CHECK_OUTPUT`` (or tagged ``nbval-check-output``). Each of those
runs as

    pytest --nbval-lax --nbval-current-env --nbval-cell-timeout=300 notebooks/X.ipynb

would run it, with one difference: a notebook that declares ``fast`` in its ``parameters``
cell runs with ``fast = True`` appended to that cell (as papermill's ``-p fast True`` would
set it), so the suite runs each notebook once, at its CPU size, in a kernel of this
virtualenv, and compares only the marked cells' outputs. The marked cells print what does not
depend on ``fast`` (counts, formulas, layouts), so the committed outputs are also what a
learner sees with the defaults. ``tests/test_notebooks.py`` executes the other notebooks
through papermill (labkit's course runner) with ``fast=True``.
The items carry the ``notebooks`` marker, so ``pytest -m "not notebooks"`` skips them.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import nbformat
import pytest
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, RunningKernel
from nbval.plugin import IPyNbFile, find_comment_markers, find_metadata_tags

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NBVAL_FOLDERS = (ROOT / "notebooks", HERE / "notebooks")
NBVAL_CELL_TIMEOUT_S = 300.0
_NBVAL_DEFAULT_CELL_TIMEOUT_S = 2000.0  # nbval 0.11's default for --nbval-cell-timeout

# The fixture notebooks are data for the tests, not tests: keep collectors (nbval's own, when
# someone passes --nbval) off them; the hook below picks the ones nbval must check.
collect_ignore_glob = ["notebooks/*.ipynb"]


def checks_output(path: Path) -> bool:
    """True when a notebook has a cell whose output nbval compares in lax mode."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        options = dict(find_metadata_tags(cell.metadata))
        options.update(find_comment_markers(cell.source))
        if options.get("check"):
            return True
    return False


def checked_notebooks() -> list[Path]:
    """The notebooks nbval verifies in a plain ``pytest`` run, sorted."""
    found = []
    for folder in NBVAL_FOLDERS:
        if folder.is_dir():
            found += [p for p in sorted(folder.glob("*.ipynb")) if checks_output(p)]
    return found


NBVAL_PARAMETERS = {"fast": True}  # set in the parameters cell of the notebooks nbval runs


def with_parameters(source: str, parameters: dict) -> str:
    """A ``parameters`` cell's source with the values of the names it declares appended."""
    declared = [k for k in parameters if re.search(rf"^{re.escape(k)}\s*[:=]", source, re.M)]
    lines = [f"{k} = {parameters[k]!r}  # set by the test suite" for k in declared]
    return "\n".join([source.rstrip("\n"), *lines]) if lines else source


class LaxNotebook(IPyNbFile):
    """nbval's notebook collector with ``--nbval-lax --nbval-current-env`` semantics."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.compare_outputs = False  # lax: only marked cells are compared

    def collect(self):
        for item in super().collect():
            if "parameters" in item.cell.metadata.get("tags", []):
                item.cell.source = with_parameters(item.cell.source, NBVAL_PARAMETERS)
            yield item

    def setup(self):
        # The kernel of the Python running pytest (the venv), whatever the notebook names.
        self.kernel = RunningKernel(
            CURRENT_ENV_KERNEL_NAME,
            cwd=str(self.path.parent),
            startup_timeout=self.config.option.nbval_kernel_startup_timeout,
        )
        self.setup_sanitize_files()


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "nbval_cell_timeout", None) == _NBVAL_DEFAULT_CELL_TIMEOUT_S:
        config.option.nbval_cell_timeout = NBVAL_CELL_TIMEOUT_S


class CheckedNotebooks(pytest.Collector):
    """The nbval notebooks, gathered under ``tests/test_notebooks.py`` (one node per hook call)."""

    def collect(self):
        for path in checked_notebooks():
            yield LaxNotebook.from_parent(self, path=path)


@pytest.hookimpl(trylast=True)  # after the test module, so papermill's tests come first
def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path != HERE / "test_notebooks.py":
        return None
    # Sharing the file's path keeps the items when only tests/test_notebooks.py is selected.
    node = CheckedNotebooks.from_parent(parent, name="nbval", path=file_path)
    node.add_marker(pytest.mark.notebooks)
    return node


def ctrl_c_as_in_a_terminal() -> None:
    """SIGINT raises KeyboardInterrupt, as in a terminal or a Jupyter kernel.

    A non-interactive shell starts its background jobs with SIGINT ignored (POSIX), and a
    Python started that way keeps it ignored; the tests that press Ctrl-C themselves restore
    the default for their process (and, as ``preexec_fn``, for the scripts they start).
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def sigint_default():
    """``ctrl_c_as_in_a_terminal`` for one test; the previous handler afterwards."""
    old = signal.getsignal(signal.SIGINT)
    ctrl_c_as_in_a_terminal()
    yield
    signal.signal(signal.SIGINT, old)
