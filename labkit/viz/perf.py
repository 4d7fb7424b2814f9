"""Figures for performance tuning: measured speedups against a baseline of the same run.

Introduced in notebooks/20_performance_tuning.ipynb.

- ``speedup_bars``: one horizontal bar per change, its speedup (ratio of median times, the
  baseline's over the change's), a tick at its worst round, and a line at 1 (no change).

Reads a ``lk.profile.SpeedupTable`` by its ``rows()``; no torch.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

__all__ = ["speedup_bars"]


def speedup_bars(table: Any, title: str | None = None) -> Figure:
    """Speedup of each change vs the baseline, with its worst round marked.

    Args:
        table: a ``lk.profile.SpeedupTable`` (anything with ``baseline`` and ``rows()``
            giving ``name``, ``median_s``, ``ratio`` and ``min_ratio``).
        title: the figure title.

    Returns:
        matplotlib.figure.Figure: one axes, the baseline on top, speedup on x.

    Raises:
        ValueError: the table has no rows.
    """
    rows = list(table.rows())
    if not rows:
        raise ValueError("speedup_bars needs a table with at least one row")
    fig = Figure(figsize=(7, 0.55 * len(rows) + 1.4), layout="constrained")
    ax = fig.add_subplot()
    y = list(range(len(rows)))[::-1]
    colors = ["#7f7f7f" if r.name == table.baseline else "#2ca02c" for r in rows]
    ax.barh(y, [r.ratio for r in rows], color=colors, height=0.6)
    ax.plot([r.min_ratio for r in rows], y, "k|", markersize=14, label="worst round")
    for yi, r in zip(y, rows, strict=True):
        ax.text(r.ratio, yi, f" {r.ratio:.2f}x  ({1e3 * r.median_s:.0f} ms)", va="center")
    ax.axvline(1.0, color="k", linewidth=0.8)
    ax.set_yticks(y, [r.name for r in rows])
    ax.set_xlabel(f"speedup vs {table.baseline!r} (median time ratio, same run)")
    ax.set_xlim(0, max(max(r.ratio for r in rows), 1.0) * 1.35)
    ax.legend(loc="lower right")
    ax.set_title(title or "measured speedups")
    return fig
