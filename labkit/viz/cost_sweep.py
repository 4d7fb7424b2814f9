"""Predicted time of a collective against message size, with measured points if given.

Introduced in notebooks/05_communication_cost.ipynb (the cost explorer of ``lk.widgets``).

Lines come from ``labkit.costmodel.predict`` (the α-β-γ model, Thakur, Rabenseifner and Gropp
2005); points are measured rows such as ``lk.bench.BenchResult`` (``op``, ``n_bytes``,
``time_s``, ``world_size``), or their ``as_dict()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from matplotlib.figure import Figure

from labkit.costmodel import Network, predict
from labkit.viz.cost import _COLORS, _grid, _log_axes

__all__ = ["predicted_time_sweep"]


def _field(row: Any, name: str) -> Any:
    """``row.name`` or ``row[name]``: benchmark rows as objects or plain dicts."""
    return row[name] if isinstance(row, dict) else getattr(row, name)


def predicted_time_sweep(
    collective: str,
    world_size: int,
    network: Network,
    algorithms: Iterable[str],
    sizes: Sequence[float] = (8.0, float(1 << 30)),
    measured: Sequence[Any] = (),
    mark_bytes: float | None = None,
    title: str = "",
) -> Figure:
    """Predicted time against size for each algorithm; measured rows as points.

    Args:
        collective: as ``lk.costmodel.predict``.
        world_size: number of ranks p of the prediction.
        network: the ``Network`` (α, β, γ).
        algorithms: one line each (e.g. ``["ring", "tree"]``).
        sizes: the x range: its smallest and largest size in bytes.
        measured: rows of ``collective`` (other ops are skipped), drawn as points labelled
            by their world size.
        mark_bytes: mark this size on every line (the widget's chosen size).
        title: the figure's title.

    Returns:
        A ``Figure`` with one log-log axis, time in seconds.

    Raises:
        ValueError: as ``predict``, or no algorithms.
    """
    algorithms = list(algorithms)
    if not algorithms:
        raise ValueError("predicted_time_sweep needs at least one algorithm")
    grid = _grid(max(min(sizes), 1.0), max(sizes))
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    for i, a in enumerate(algorithms):
        color = _COLORS[i % len(_COLORS)]
        ax.plot(
            grid,
            [predict(collective, n, world_size, network, a) for n in grid],
            "-",
            color=color,
            label=f"{a} (model, p = {world_size})",
        )
        if mark_bytes is not None:
            t = predict(collective, mark_bytes, world_size, network, a)
            ax.plot([mark_bytes], [t], "o", color=color, ms=8, mfc="white", mew=2)
    rows = [r for r in measured if _field(r, "op") == collective]
    for j, p in enumerate(sorted({_field(r, "world_size") for r in rows})):
        mine = sorted(
            (r for r in rows if _field(r, "world_size") == p), key=lambda r: _field(r, "n_bytes")
        )
        ax.plot(
            [_field(r, "n_bytes") for r in mine],
            [_field(r, "time_s") for r in mine],
            "x",
            color=_COLORS[(len(algorithms) + j) % len(_COLORS)],
            ms=7,
            label=f"measured, p = {p}",
        )
    _log_axes(ax, "size n (bytes)", "time (s)")
    ax.legend(fontsize=8)
    ax.set_title(title or f"{collective} on {world_size} ranks, {network.label()}", fontsize=9)
    return fig
