"""Record a notebook's key numbers so ``labkit course run`` can read them back.

Introduced in notebooks/00_setup_and_launcher.ipynb.

``lk.record("busbw_gbps", 1.2)`` shows the value in the notebook and, in an IPython kernel,
also emits it as a display output with the MIME type below; papermill keeps that output in
the executed notebook, where the course runner finds it (the scrapbook "glue" pattern).
"""

from __future__ import annotations

import json
import math
from typing import Any

MIME = "application/vnd.labkit.record+json"

_values: dict[str, Any] = {}


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            pass
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    json.dumps(value)  # raises TypeError for anything the report could not show
    return value


def record(name: str, value: Any) -> Any:
    """Record ``value`` under ``name`` for the course report, and return it.

    Args:
        name: a short identifier, e.g. ``"busbw_gbps"``.
        value: a number, string, bool, or a list/dict of them (numpy/torch scalars converted).

    Returns:
        ``value`` unchanged, so ``x = lk.record("x", compute())`` reads naturally.

    Raises:
        TypeError: ``value`` cannot be written as JSON.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"record name must be a non-empty string, got {name!r}")
    try:
        clean = _jsonable(value)
    except TypeError as exc:
        raise TypeError(
            f"lk.record({name!r}, ...) needs a number, string or list/dict of them; "
            f"got {type(value).__name__}"
        ) from exc
    _values[name] = clean
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None and getattr(shell, "kernel", None) is not None:
        from IPython.display import display

        text = f"recorded {name} = {clean!r}"
        display({MIME: {"name": name, "value": clean}, "text/plain": text}, raw=True)
    return value


def recorded() -> dict[str, Any]:
    """Every value recorded in this process so far (a copy)."""
    return dict(_values)
