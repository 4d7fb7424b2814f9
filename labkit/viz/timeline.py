"""The timeline of a distributed step: one lane per rank, compute / communication / idle.

Introduced in notebooks/04_custom_backend.ipynb.

Draws a ``lk.trace.Timeline`` (spans merged from every rank): in each rank's lane, compute
spans fill the upper half and communication spans the lower half (they overlap in time when
DDP all-reduces a bucket during the backward pass), and the gaps no span covers are shaded as
idle. This module reads spans by their attributes and never imports torch.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

__all__ = ["timeline"]

COLORS = {"compute": "#1f77b4", "comm": "#ff7f0e", "idle": "#d9d9d9"}
_HALF = 0.38  # half-lane height


def timeline(tl: Any, title: str | None = None, label_ops: bool = True) -> Figure:
    """Per-rank lanes of compute, communication and idle time, from a merged timeline.

    Args:
        tl: a ``lk.trace.Timeline`` (``lk.trace.Timeline.merge(per_rank_events)``).
        title: the figure title (default: a summary of the world size and span).
        label_ops: write each communication op's name on its bar when it is wide enough.

    Returns:
        matplotlib.figure.Figure: x in milliseconds from the first span, rank 0 on top.

    Raises:
        ValueError: ``tl`` has no ranks.
    """
    if tl.world_size < 1:
        raise ValueError("the timeline has no ranks")
    fig = Figure(figsize=(10, 1.0 + 0.7 * tl.world_size), layout="constrained")
    ax = fig.add_subplot()
    end_ms = max(tl.end_ns / 1e6, 1e-6)
    for rank in range(tl.world_size):
        gaps = [(a / 1e6, (b - a) / 1e6) for a, b in tl.idle[rank]]
        ax.broken_barh(
            gaps,
            (rank - _HALF, 2 * _HALF),
            facecolors=COLORS["idle"],
            hatch="//",
            edgecolor="white",
            linewidth=0,
        )
        for s in tl.of_rank(rank):
            comm = s.kind == "comm"
            y = rank if comm else rank - _HALF  # y grows downwards: comm in the lower half
            x, w = s.start_ns / 1e6, max(s.duration_ns / 1e6, end_ms * 1e-4)
            ax.broken_barh(
                [(x, w)],
                (y, _HALF),
                facecolors=COLORS["comm" if comm else "compute"],
                edgecolor="black",
                linewidth=0.3,
                alpha=0.9,
            )
            if label_ops and w > end_ms * 0.06:
                ax.text(
                    x + w / 2,
                    y + _HALF / 2,
                    s.name,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white",
                    clip_on=True,
                )
    ax.set_ylim(tl.world_size - 0.5, -0.5)
    ax.set_xlim(0, end_ms)
    ax.set_yticks(range(tl.world_size), [f"rank {r}" for r in range(tl.world_size)])
    ax.set_xlabel("time (ms) from the first span")
    ax.grid(axis="x", alpha=0.3)
    handles = [
        Patch(facecolor=COLORS["compute"], label="compute"),
        Patch(facecolor=COLORS["comm"], label="communication"),
        Patch(facecolor=COLORS["idle"], hatch="//", edgecolor="white", label="idle"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False)
    ax.set_title(title or f"{tl.world_size} ranks, {end_ms:.2f} ms")
    return fig
