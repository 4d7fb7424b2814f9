"""Collective diagrams drawn from real data: one row per rank, before → after.

Introduced in notebooks/02_collectives.ipynb.

The picture follows the usual way collectives are drawn (e.g. the NCCL user guide's
"Collective Operations" page, or Thakur, Rabenseifner and Gropp 2005, Fig. 1): each rank
is a row, its buffer a strip of boxes, the operation an arrow. Here the boxes hold the
values the ranks really had, and a value copied from another rank keeps that rank's colour,
so the data movement is visible in the figure itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

__all__ = ["collective_diagram", "value_origins"]

MAX_BOXES = 24  # values drawn per rank and side; longer buffers end with a "+N" box
_UNIT_IN = 0.5  # inches per box, shrunk when the figure would be wider than _MAX_WIDTH_IN
_MAX_WIDTH_IN = 15.0
_ROW = 1.35  # row pitch in box units
_GAP = 2.2  # box units between the before and after columns (room for the arrow)
_LABEL = 1.9  # box units left of the boxes for "rank r"
_NEUTRAL = "#e6e6e6"  # fill of a combined (reduced) value
_NO_DATA = "(none)"


def _flatten(x: Any) -> list[float]:
    if hasattr(x, "tolist") and callable(x.tolist):  # torch / numpy
        x = x.tolist()
    if isinstance(x, (int, float, bool)):
        return [x]
    out: list[float] = []
    for item in x:
        out.extend(_flatten(item))
    return out


def _as_rows(data: Sequence[Any], what: str) -> list[list[float] | None]:
    if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
        raise TypeError(f"{what} must be a list with one entry per rank, got {type(data).__name__}")
    return [None if d is None else _flatten(d) for d in data]


def _fmt(v: float) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if float(v).is_integer() and abs(v) < 1e6:
        return str(int(v))
    return f"{v:.3g}"


def value_origins(before: Sequence[Any], after: Sequence[Any]) -> list[list[int | None] | None]:
    """For every value each rank holds after a collective, the rank that held it before.

    A value is traced to a rank when exactly that one rank held it before the collective;
    values found on no rank (reductions) or on several ranks get ``None``. With
    recognisable inputs (rank r holds ``[10r, 10r+1]``) this shows where data travelled,
    which lets a notebook count the elements a rank received from the others.

    Args:
        before: one entry per rank: a 1-D tensor, a list of numbers, or ``None`` (no data).
        after: the same after the collective.

    Returns:
        One entry per rank: ``None`` where ``after`` is ``None``, else a list with the source
        rank (or ``None``) of each value.

    Raises:
        ValueError: ``before`` and ``after`` have different numbers of ranks.
    """
    rows_b, rows_a = _as_rows(before, "before"), _as_rows(after, "after")
    if len(rows_b) != len(rows_a):
        raise ValueError(f"before has {len(rows_b)} ranks but after has {len(rows_a)}")
    holders: dict[float, set[int]] = {}
    for rank, row in enumerate(rows_b):
        for v in row or []:
            holders.setdefault(v, set()).add(rank)
    out: list[list[int | None] | None] = []
    for row in rows_a:
        if row is None:
            out.append(None)
            continue
        src = [holders.get(v, set()) for v in row]
        out.append([next(iter(s)) if len(s) == 1 else None for s in src])
    return out


def _palette(world_size: int) -> list[Any]:
    from matplotlib import colormaps

    # tab10 without its grey (index 7), which would read as a combined value
    tab10 = colormaps["tab10"]
    colors = [tab10(i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)]
    if world_size > len(colors):
        tab20 = colormaps["tab20"]
        colors += [tab20(i) for i in range(1, 20, 2) if i != 15]  # lighter halves, no grey
    return [colors[r % len(colors)] for r in range(world_size)]


def _lighter(color: Any, amount: float = 0.6) -> tuple[float, float, float]:
    r, g, b = color[:3]
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def _draw_row(ax, x0, y, values, colors, fontsize) -> None:
    """Boxes for one rank's buffer starting at ``x0``; ``colors`` is (face, edge) per value."""
    if values is None or len(values) == 0:
        ax.text(
            x0,
            y,
            _NO_DATA if values is None else "(empty)",
            ha="left",
            va="center",
            fontsize=fontsize,
            color="0.45",
            style="italic",
        )
        return
    shown = values if len(values) <= MAX_BOXES else values[: MAX_BOXES - 1]
    for i, v in enumerate(shown):
        face, edge = colors[i]
        ax.add_patch(
            Rectangle(
                (x0 + i + 0.05, y - 0.45), 0.9, 0.9, facecolor=face, edgecolor=edge, linewidth=1.2
            )
        )
        ax.text(x0 + i + 0.5, y, _fmt(v), ha="center", va="center", fontsize=fontsize)
    if len(shown) < len(values):
        ax.text(
            x0 + len(shown) + 0.5,
            y,
            f"+{len(values) - len(shown)}",
            ha="center",
            va="center",
            fontsize=fontsize,
            color="0.35",
        )


def collective_diagram(
    name: str,
    before: Sequence[Any],
    after: Sequence[Any],
    title: str | None = None,
    *,
    reduced: bool | None = None,
) -> Figure:
    """Draw what every rank held before and after a collective, from the real values.

    One row per rank: the rank's input as labelled boxes, an arrow, its output. Inputs take
    their rank's colour; an output value copied from exactly one rank keeps that rank's
    colour (see ``value_origins``), and a combined value (a reduction) is drawn grey. Before
    and after may differ in length (gather, scatter, all_gather, reduce_scatter); ``None``
    marks a rank with no buffer on that side (e.g. non-root ranks of gather).

    Args:
        name: the collective, e.g. ``"all_reduce"``; shown in the title.
        before: one entry per rank: a 1-D tensor, a list of numbers, or ``None``.
        after: one entry per rank, the same after the collective.
        title: the figure's title (default: ``"<name> on <p> ranks"``).
        reduced: whether outputs are combinations of inputs, drawn grey rather than traced
            to a source rank; default: ``"reduce" in name``.

    Returns:
        A ``matplotlib.figure.Figure`` (not attached to pyplot).

    Raises:
        ValueError: no ranks, or ``before`` and ``after`` have different numbers of ranks.
        TypeError: ``before`` or ``after`` is not a list with one entry per rank.
    """
    rows_b, rows_a = _as_rows(before, "before"), _as_rows(after, "after")
    p = len(rows_b)
    if p == 0:
        raise ValueError("before and after must hold one entry per rank; got none")
    if len(rows_a) != p:
        raise ValueError(f"before has {p} ranks but after has {len(rows_a)}")
    if reduced is None:
        reduced = "reduce" in name.lower()
    origins = [None] * p if reduced else value_origins(rows_b, rows_a)
    palette = _palette(p)

    def width(rows):
        return max([min(len(r), MAX_BOXES) for r in rows if r] + [2])

    nb, na = width(rows_b), width(rows_a)
    units_w = _LABEL + nb + _GAP + na + 0.3
    units_h = p * _ROW + 1.2  # rows plus the column headings
    unit_in = min(_UNIT_IN, _MAX_WIDTH_IN / units_w)
    title_in = 0.5
    fig = Figure(figsize=(units_w * unit_in, units_h * unit_in + title_in))
    ax = fig.add_axes((0.0, 0.0, 1.0, units_h * unit_in / (units_h * unit_in + title_in)))
    ax.set_xlim(-_LABEL, nb + _GAP + na + 0.3)
    ax.set_ylim(-(p - 0.5) * _ROW - 0.3, 0.9 * _ROW)
    ax.axis("off")
    longest = max((len(_fmt(v)) for r in rows_b + rows_a if r for v in r), default=1)
    fontsize = max(4.5, min(10.0, unit_in * 72 * 0.32 * min(1.0, 3.6 / max(longest, 1))))
    label_size = max(6.0, min(10.0, unit_in * 72 * 0.3))

    xa = nb + _GAP  # left edge of the after column
    ax.text(
        nb / 2, 0.55 * _ROW, "before", ha="center", va="center", fontsize=label_size, weight="bold"
    )
    ax.text(
        xa + na / 2,
        0.55 * _ROW,
        "after",
        ha="center",
        va="center",
        fontsize=label_size,
        weight="bold",
    )
    grey_used = False
    for rank in range(p):
        y = -rank * _ROW
        color = palette[rank]
        ax.text(
            -0.25,
            y,
            f"rank {rank}",
            ha="right",
            va="center",
            fontsize=label_size,
            color=color,
            weight="bold",
        )
        vb = rows_b[rank]
        _draw_row(ax, 0.0, y, vb, [(_lighter(color), color)] * len(vb or []), fontsize)
        ax.annotate(
            "",
            xy=(xa - 0.35, y),
            xytext=(nb + 0.35, y),
            arrowprops={"arrowstyle": "-|>", "color": "0.4", "lw": 1.2},
        )
        va, src = rows_a[rank], origins[rank]
        colors = []
        for i in range(len(va or [])):
            s = src[i] if src else None
            if s is None:
                grey_used = True
                colors.append((_NEUTRAL, "0.25"))
            else:
                colors.append((_lighter(palette[s]), palette[s]))
        _draw_row(ax, xa, y, va, colors, fontsize)

    fig.text(
        0.5,
        1 - 0.3 * title_in / fig.get_figheight(),
        title or f"{name} on {p} ranks",
        ha="center",
        va="center",
        fontsize=max(8.0, label_size + 1),
        weight="bold",
    )
    if grey_used:
        fig.text(
            0.995,
            0.005,
            "grey: combined from (or held by) several ranks",
            ha="right",
            va="bottom",
            fontsize=max(5.0, label_size - 2.5),
            color="0.4",
        )
    return fig
