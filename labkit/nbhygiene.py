"""Keep committed notebooks clean: no outputs, except cells whose output nbval checks.

A code cell containing ``# NBVAL_CHECK_OUTPUT`` keeps its output (deterministic, and the point
of the lesson) and a stable execution count (nbval needs one); every other output, every other
execution count and papermill's metadata go.

    python -m labkit.nbhygiene strip notebooks/*.ipynb      # clean in place
    python -m labkit.nbhygiene check notebooks/*.ipynb      # exit 1 and list what is dirty
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MARK = "NBVAL_CHECK_OUTPUT"
_CELL_META_DROP = ("execution", "papermill", "collapsed", "scrolled", "ExecuteTime")
_NB_META_DROP = ("papermill", "widgets")


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def is_checked(cell: dict) -> bool:
    """True when nbval must verify this cell's committed output."""
    return cell.get("cell_type") == "code" and MARK in _source(cell)


def strip(nb: dict) -> dict:
    """Return ``nb`` without outputs (except checked cells), execution counts and run metadata."""
    checked = 0
    for cell in nb.get("cells", []):
        for key in _CELL_META_DROP:
            cell.get("metadata", {}).pop(key, None)
        if cell.get("cell_type") != "code":
            continue
        if is_checked(cell) and cell.get("outputs"):
            # nbval refuses a cell with outputs and no execution count ("Unrun reference
            # cell"), so checked cells are numbered 1, 2, ... in order: stable across runs.
            checked += 1
            cell["execution_count"] = checked
            for out in cell["outputs"]:
                if "execution_count" in out:
                    out["execution_count"] = checked
                out.get("metadata", {}).clear()
        else:
            cell["execution_count"] = None
            cell["outputs"] = []
    for key in _NB_META_DROP:
        nb.get("metadata", {}).pop(key, None)
    return nb


def problems(nb: dict) -> list[str]:
    """What makes a notebook unfit to commit (empty list when clean)."""
    found = []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        if cell.get("execution_count") is not None and not is_checked(cell):
            found.append(f"cell {i}: execution_count is set")
        if cell.get("outputs") and not is_checked(cell):
            found.append(f"cell {i}: has outputs but is not marked {MARK}")
        if is_checked(cell) and not cell.get("outputs"):
            found.append(f"cell {i}: marked {MARK} but has no committed output to check")
    if "papermill" in nb.get("metadata", {}):
        found.append("notebook metadata carries papermill run data")
    return found


def _write(path: Path, nb: dict) -> None:
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("strip", "check"):
        print(__doc__)
        return 2
    cmd, paths = argv[0], [Path(p) for p in argv[1:]]
    bad = 0
    for path in paths:
        nb = json.loads(path.read_text())
        if cmd == "strip":
            _write(path, strip(nb))
        else:
            for p in problems(nb):
                print(f"{path}: {p}")
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
