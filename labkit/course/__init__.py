"""Run the course headlessly: papermill executes each notebook, a report collects the results.

Introduced in notebooks/00_setup_and_launcher.ipynb. From a shell:

    labkit course run --fast                       # all notebooks, fast parameters
    labkit course run --only 00,03 --world-size 2  # two notebooks on 2 ranks
    labkit course list                             # notebooks and their parameters

From Python::

    from labkit.course import run_course
    results = run_course(parameters={"fast": True})   # writes course-output/report.html

``run.py`` executes notebooks (``kernel.py`` is the Jupyter client it drives kernels with),
``readback.py`` reads records, figures and errors out of an executed notebook, ``report.py``
writes ``summary.json`` and ``report.html``, ``args.py`` checks the command's parameters before
any notebook runs.
"""

from __future__ import annotations

from labkit.course.args import course_parameters, parse_param
from labkit.course.readback import NotebookError, read_executed
from labkit.course.report import machine_info, render_html, write_report
from labkit.course.run import (
    DEFAULT_CELL_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_OUTPUT_DIR,
    NotebookResult,
    declared_parameters,
    default_notebooks_dir,
    find_notebooks,
    run_course,
    run_notebook,
    select_notebooks,
    status_line,
)

__all__ = [
    "DEFAULT_CELL_TIMEOUT_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_OUTPUT_DIR",
    "NotebookError",
    "NotebookResult",
    "course_parameters",
    "declared_parameters",
    "default_notebooks_dir",
    "find_notebooks",
    "machine_info",
    "parse_param",
    "read_executed",
    "render_html",
    "run_course",
    "run_notebook",
    "select_notebooks",
    "status_line",
    "write_report",
]
