"""Execute course notebooks headlessly with papermill.

Introduced in notebooks/00_setup_and_launcher.ipynb (``labkit course run`` in its summary).

    labkit course run --fast                 # every notebooks/NN_*.ipynb, fast parameters
    labkit course run --only 00,03 --world-size 2 --output /tmp/course
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from labkit.course.readback import (
    NotebookError,
    NotebookResult,
    read_executed,
    source_cell,
    strip_ansi,
)
from labkit.launcher.launch_log import LAUNCH_LOG_ENV, read_launch_log

_COURSE_NAME = re.compile(r"^(\d\d)_.+\.ipynb$")
DEFAULT_CELL_TIMEOUT_S = 600.0
DEFAULT_IDLE_TIMEOUT_S = 60.0  # an idle kernel with a cell waiting on it: see kernel.py
DEFAULT_OUTPUT_DIR = "course-output"


def default_notebooks_dir() -> Path:
    """The course's ``notebooks/`` folder: next to the package (editable install), else ./notebooks.

    Returns:
        The first of those that exists (the repository's when neither does).
    """
    repo = Path(__file__).resolve().parents[2] / "notebooks"
    for candidate in (repo, Path.cwd() / "notebooks"):
        if candidate.is_dir():
            return candidate
    return repo


def find_notebooks(notebooks_dir: str | Path | None = None) -> list[Path]:
    """The course notebooks ``NN_*.ipynb`` in ``notebooks_dir``, in course order.

    Args:
        notebooks_dir: folder to search; None means :func:`default_notebooks_dir`.

    Returns:
        Sorted paths (empty when the folder has none).

    Raises:
        FileNotFoundError: the folder does not exist.
    """
    folder = Path(notebooks_dir) if notebooks_dir is not None else default_notebooks_dir()
    if not folder.is_dir():
        raise FileNotFoundError(f"no notebooks folder at {folder} (pass --notebooks DIR)")
    return sorted(p for p in folder.iterdir() if _COURSE_NAME.match(p.name))


def select_notebooks(notebooks: Iterable[Path], only: Iterable[str] | None) -> list[Path]:
    """Keep the notebooks named in ``only`` (numbers like ``"03"`` or ``"3"``, or file stems).

    Args:
        notebooks: course notebooks, as from :func:`find_notebooks`.
        only: selectors; None or empty keeps everything.

    Returns:
        The selected notebooks, in course order.

    Raises:
        ValueError: a selector matches no notebook (the message lists the notebooks there are).
    """
    notebooks = list(notebooks)
    wanted = [s.strip() for s in (only or []) if s.strip()]
    if not wanted:
        return notebooks

    def matches(path: Path, selector: str) -> bool:
        if selector.isdigit():
            return int(selector) == int(path.name[:2])
        return selector in (path.stem, path.name)

    unknown = [s for s in wanted if not any(matches(p, s) for p in notebooks)]
    if unknown:
        names = ", ".join(p.name for p in notebooks) or "none"
        raise ValueError(f"--only {','.join(unknown)}: no such notebook (there are: {names})")
    return [p for p in notebooks if any(matches(p, s) for s in wanted)]


def declared_parameters(path: str | Path) -> dict[str, dict[str, Any]]:
    """The parameters a notebook declares in its cell tagged ``parameters``.

    Args:
        path: the notebook.

    Returns:
        ``papermill.inspect_notebook``'s mapping: name -> {name, inferred_type_name, default,
        help}; empty when the notebook has no parameters cell.
    """
    import papermill

    return papermill.inspect_notebook(str(path))


def run_notebook(
    path: str | Path,
    output_dir: str | Path,
    parameters: Mapping[str, Any] | None = None,
    *,
    cell_timeout: float | None = DEFAULT_CELL_TIMEOUT_S,
    start_timeout: float = 60.0,
    kernel_name: str = "python3",
    progress_bar: bool = False,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S,
    kernel_manager_class: type | None = None,
) -> NotebookResult:
    """Execute one notebook with papermill and read back what it produced.

    Only the parameters the notebook declares are injected, so ``fast=True`` can be offered to
    every notebook. The kernel runs in the notebook's folder. A failing notebook is reported in
    the result (its executed copy keeps the traceback), not raised. The kernel inherits
    ``LABKIT_LAUNCH_LOG``, so each launch in it notes the backend and device it resolved to.

    The kernel is driven by :class:`labkit.course.kernel.WatchedKernelClient`: a cell whose
    reply is lost fails with :class:`~labkit.course.kernel.KernelIdleError` once the kernel has
    been idle for ``idle_timeout`` seconds, and a shell send cannot strand a reply (the stall of
    a whole cell timeout that widget cells used to hit; see ``labkit/course/kernel.py``).

    Args:
        path: the notebook to run.
        output_dir: where the executed copy is written (same file name); created if missing.
        parameters: values offered to the notebook, e.g. ``{"fast": True, "world_size": 2}``.
        cell_timeout: seconds one cell may run before the notebook fails (None: no limit).
        start_timeout: seconds to wait for the kernel to start.
        kernel_name: Jupyter kernel to run it on.
        progress_bar: show papermill's tqdm bar (one tick per cell).
        idle_timeout: seconds a cell may wait for its reply from an idle kernel (0: no limit).
        kernel_manager_class: the Jupyter kernel manager (None: labkit's
            :class:`~labkit.course.kernel.WatchedKernelManager`); benchmarks/papermill_soak.py
            passes jupyter_client's ``AsyncKernelManager`` to measure the stall it fixes.

    Returns:
        A :class:`NotebookResult`.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the executed copy would overwrite ``path``.
    """
    import nbformat
    import papermill
    from traitlets.config import Config

    from labkit.course.kernel import WatchedKernelManager

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no notebook at {path}")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    output_path = output_dir / path.name
    if output_path.resolve() == path.resolve():
        raise ValueError(f"output folder {output_dir} holds the notebook itself; choose another")
    output_path.unlink(missing_ok=True)  # never read back a previous run's outputs

    passed: dict[str, Any] = {}
    failure: Exception | None = None
    log_dir = tempfile.TemporaryDirectory(prefix="labkit-launches-")
    launch_log = Path(log_dir.name) / "launches.jsonl"
    saved_env = os.environ.get(LAUNCH_LOG_ENV)
    os.environ[LAUNCH_LOG_ENV] = str(launch_log)  # the kernel inherits it; see launch_log.py
    start = time.perf_counter()
    try:
        declared = declared_parameters(path)  # fails too on a notebook that is not valid JSON
        passed = {k: v for k, v in (parameters or {}).items() if k in declared}
        papermill.execute_notebook(
            str(path),
            str(output_path),
            parameters=passed,
            kernel_name=kernel_name,
            progress_bar={"desc": path.stem, "leave": False} if progress_bar else False,
            cwd=str(path.parent),
            execution_timeout=cell_timeout,
            start_timeout=start_timeout,
            # ipykernel warns at every start that its loopback channels are unencrypted
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
            # nbclient options, passed on by papermill: the client (kernel.py) and its watch
            kernel_manager_class=kernel_manager_class or WatchedKernelManager,
            config=Config({"WatchedKernelClient": {"idle_timeout": float(idle_timeout or 0)}}),
        )
    except Exception as exc:  # a failing notebook is a result, not a crash
        failure = exc
    finally:
        if saved_env is None:
            os.environ.pop(LAUNCH_LOG_ENV, None)
        else:
            os.environ[LAUNCH_LOG_ENV] = saved_env
    seconds = time.perf_counter() - start
    launches = [asdict(launch) for launch in read_launch_log(launch_log)]
    log_dir.cleanup()

    executed = nbformat.read(output_path, as_version=4) if output_path.exists() else {}
    back = read_executed(executed)
    error, failing_cell = back.error, back.failing_cell
    if failure is not None and (error is None or isinstance(failure, TimeoutError)):
        # A dead kernel leaves no error output, and a cell timeout leaves only the
        # KeyboardInterrupt of the kernel's shutdown: name the real cause, keep the traceback.
        index = error.cell_index if error is not None else back.last_started
        error = NotebookError(
            ename=type(failure).__name__,
            evalue=strip_ansi(str(failure)).strip(),
            traceback=error.traceback if error is not None else "",
            cell_index=index,
        )
        if failing_cell is None and index is not None:
            failing_cell = source_cell(nbformat.read(path, as_version=4), index)
    return NotebookResult(
        name=path.name,
        path=path,
        output_path=output_path,
        status="ok" if failure is None and error is None else "failed",
        seconds=seconds,
        parameters=passed,
        records=back.records,
        figures=len(back.figures),
        error=error,
        failing_cell=failing_cell,
        launches=launches,
    )


def run_course(
    notebooks_dir: str | Path | None = None,
    output_dir: str | Path = DEFAULT_OUTPUT_DIR,
    *,
    only: Iterable[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
    cell_timeout: float | None = DEFAULT_CELL_TIMEOUT_S,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S,
    progress_bar: bool = True,
    report: bool = True,
    log: Callable[[str], None] | None = print,
) -> list[NotebookResult]:
    """Run the course notebooks in order, keep going past failures, and write the report.

    Args:
        notebooks_dir: folder of ``NN_*.ipynb`` notebooks (None: :func:`default_notebooks_dir`).
        output_dir: receives the executed notebooks, ``report.html`` and ``summary.json``.
        only: notebook selectors (see :func:`select_notebooks`); None runs all.
        parameters: offered to every notebook; each receives only those it declares.
        cell_timeout: seconds one cell may run (None: no limit).
        idle_timeout: seconds a cell may wait for its reply from an idle kernel (0: no limit).
        progress_bar: papermill's per-notebook tqdm bar.
        report: write ``report.html`` and ``summary.json`` at the end.
        log: called with one status line per notebook (None: silent).

    Returns:
        One :class:`NotebookResult` per notebook run, in order.

    Raises:
        FileNotFoundError: the notebooks folder does not exist.
        ValueError: ``only`` names a notebook that does not exist.
    """
    notebooks = select_notebooks(find_notebooks(notebooks_dir), only)
    results = []
    for i, path in enumerate(notebooks, 1):
        result = run_notebook(
            path,
            output_dir,
            parameters,
            cell_timeout=cell_timeout,
            idle_timeout=idle_timeout,
            progress_bar=progress_bar,
        )
        results.append(result)
        if log is not None:
            log(status_line(result, i, len(notebooks)))
    if report:
        from labkit.course.report import write_report

        write_report(results, output_dir)
    return results


def status_line(result: NotebookResult, index: int, total: int) -> str:
    """``[2/4] 01_point_to_point.ipynb  ok  12.3 s`` (plus the error on failure).

    Args:
        result: the notebook's result.
        index: its 1-based position in the run.
        total: how many notebooks the run has.

    Returns:
        One line, or two when the notebook failed.
    """
    line = f"[{index}/{total}] {result.name:<40} {result.status:<6} {result.seconds:7.1f} s"
    if result.error is not None:
        cell = result.error.cell_index
        where = f"cell {cell + 1}: " if cell is not None else ""
        evalue = result.error.evalue.strip().splitlines()
        line += f"\n      {where}{result.error.ename}: {evalue[0] if evalue else ''}"
    return line
