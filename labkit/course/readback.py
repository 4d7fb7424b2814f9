"""Read what an executed notebook produced: recorded numbers, figures and the first error.

Introduced in notebooks/00_setup_and_launcher.ipynb (``lk.record`` writes what this reads).

Papermill keeps every output in the executed notebook, so the course report reads its numbers
back from there (the scrapbook "glue" pattern; microsoft/recommenders reads metrics back the
same way) instead of asking the notebook process for them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.record import MIME

# Cells papermill adds to the executed notebook; they are not part of the source notebook.
_PAPERMILL_TAGS = {"injected-parameters", "papermill-error-cell-tag"}
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """Remove terminal colour codes (IPython colours its tracebacks).

    Args:
        text: text that may contain ANSI escape sequences.

    Returns:
        ``text`` without them.
    """
    return _ANSI.sub("", text)


@dataclass
class NotebookError:
    """The error that stopped a notebook.

    ``cell_index`` counts the cells of the source notebook (markdown included, papermill's
    injected cells excluded) from 0; it is None when no cell can be blamed (a kernel that never
    started, for instance).
    """

    ename: str
    evalue: str
    traceback: str = ""
    cell_index: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return {
            "ename": self.ename,
            "evalue": self.evalue,
            "traceback": self.traceback,
            "cell_index": self.cell_index,
        }


@dataclass
class Readback:
    """Everything the course report takes from one executed notebook."""

    records: dict[str, Any] = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)  # base64 PNG, in output order
    error: NotebookError | None = None
    failing_cell: str | None = None  # source of the cell that raised
    last_started: int | None = None  # source index of the last cell papermill started


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _is_papermill_cell(cell: dict) -> bool:
    return bool(_PAPERMILL_TAGS & set(cell.get("metadata", {}).get("tags", [])))


def read_executed(nb: dict) -> Readback:
    """Collect records, PNG figures and the first error from an executed notebook.

    Args:
        nb: the executed notebook (nbformat node or the plain JSON dict).

    Returns:
        A :class:`Readback`; a value recorded twice under one name keeps the last value.
    """
    out = Readback()
    index = -1  # position in the source notebook
    for cell in nb.get("cells", []):
        if _is_papermill_cell(cell):
            continue
        index += 1
        if cell.get("cell_type") != "code":
            continue
        # Started cells have a start time: after an exception other than a cell error (a
        # timeout, a lost reply) papermill marks the cells it never reached "completed" too.
        if cell.get("metadata", {}).get("papermill", {}).get("start_time") is not None:
            out.last_started = index
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            data = output.get("data", {})
            if kind in ("display_data", "execute_result"):
                if MIME in data and isinstance(data[MIME], dict) and "name" in data[MIME]:
                    out.records[data[MIME]["name"]] = data[MIME].get("value")
                if "image/png" in data:
                    out.figures.append(_text(data["image/png"]).replace("\n", ""))
            elif kind == "error" and out.error is None:
                out.error = NotebookError(
                    ename=output.get("ename", ""),
                    evalue=strip_ansi(output.get("evalue", "")),
                    traceback=strip_ansi("\n".join(output.get("traceback", []))),
                    cell_index=index,
                )
                out.failing_cell = _source(cell)
    return out


def source_cell(nb: dict, index: int) -> str | None:
    """The source of one cell of a notebook, counting as :class:`NotebookError` does.

    Args:
        nb: a source or executed notebook (papermill's added cells are skipped).
        index: 0-based cell position, markdown cells included.

    Returns:
        The cell's source, or None when there is no such cell.
    """
    cells = [c for c in nb.get("cells", []) if not _is_papermill_cell(c)]
    return _source(cells[index]) if 0 <= index < len(cells) else None


@dataclass
class NotebookResult:
    """How one notebook's run went, and what it recorded.

    ``status`` is ``"ok"`` or ``"failed"``; ``records`` are the ``lk.record`` values read back
    from the executed notebook; ``figures`` counts its PNG outputs; on failure ``error`` says
    what was raised and ``failing_cell`` holds the source of the cell that raised;
    ``launches`` lists the backend, device and world size each launch actually used.
    """

    name: str
    path: Path
    output_path: Path
    status: str
    seconds: float
    parameters: dict[str, Any] = field(default_factory=dict)
    records: dict[str, Any] = field(default_factory=dict)
    figures: int = 0
    error: NotebookError | None = None
    failing_cell: str | None = None
    # What each lk.launch in the notebook resolved to: {"backend", "device", "world_size"}.
    launches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every cell ran without raising."""
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (what ``summary.json`` lists per notebook)."""
        return {
            "name": self.name,
            "path": str(self.path),
            "output_path": str(self.output_path),
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "parameters": self.parameters,
            "records": self.records,
            "figures": self.figures,
            "launches": self.launches,
            "error": self.error.to_dict() if self.error else None,
            "failing_cell": self.failing_cell,
        }
