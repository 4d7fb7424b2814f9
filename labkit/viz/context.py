"""Causal attention's blocks over context-parallel ranks: who computes what, and how much.

Introduced in notebooks/16_context_parallel.ipynb.

The (query chunk × key chunk) grid of a causal mask, each block coloured by the rank that holds
its queries, for the contiguous and the zig-zag layouts (``labkit.parallel.context.layout``,
plain arithmetic), and the work per rank beside it — counted, and measured when given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Polygon, Rectangle

__all__ = ["causal_work"]

_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def _grid(ax, world_size: int, layout: str) -> None:
    """Draw 2p × 2p chunks (a contiguous rank holds two consecutive ones)."""
    from labkit.parallel.context.layout import chunks_of

    n = 2 * world_size
    owner = {}
    for r in range(world_size):
        held = chunks_of(r, world_size, layout)
        for c in held if layout == "zigzag" else (2 * held[0], 2 * held[0] + 1):
            owner[c] = r
    for i in range(n):  # query chunk: row i, from the top
        colour = _COLOURS[owner[i] % len(_COLOURS)]
        for j in range(i + 1):  # key chunks at or before it
            y = n - 1 - i
            if j < i:
                ax.add_patch(Rectangle((j, y), 1, 1, color=colour, ec="white", lw=0.5))
            else:  # the diagonal chunk: its lower triangle
                ax.add_patch(Polygon([(j, y + 1), (j, y), (j + 1, y)], color=colour))
    ax.set_xlim(0, n)
    ax.set_ylim(0, n)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("keys →")
    ax.set_ylabel("← queries")
    ax.set_title(f"{layout}: chunks of s/{n}")


def causal_work(
    world_size: int,
    measured: Mapping[str, Sequence[float]] | None = None,
    title: str = "",
) -> Figure:
    """The causal mask's blocks per rank for each layout, and each rank's work.

    Args:
        world_size: p, context-parallel ranks (colours repeat beyond 8).
        measured: layout → one number per rank (e.g. attention FLOPs), each drawn relative to
            its layout's mean, next to the counted work (``work_per_rank``, also relative).

    Returns:
        matplotlib.figure.Figure: a grid per layout (colour: the rank holding the queries) and
        bars of work per rank over the mean (1 = balanced).

    Raises:
        ValueError: world_size < 1.
    """
    # the layouts' package imports torch: loaded when a figure is drawn, not with lk.viz
    from labkit.parallel.context.layout import LAYOUTS, work_per_rank

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    axes = fig.subplots(1, 3, width_ratios=[1, 1, 1.3])
    for ax, layout in zip(axes[:2], LAYOUTS, strict=True):
        _grid(ax, world_size, layout)
    bars = axes[2]
    width = 0.4
    for k, layout in enumerate(LAYOUTS):
        work = work_per_rank(world_size, layout)
        mean = sum(work) / len(work)
        xs = [r + (k - 0.5) * width for r in range(world_size)]
        label, colour = f"{layout}: useful work (counted)", ("#b0b0b0", "#505050")[k]
        bars.bar(xs, [w / mean for w in work], width=width, label=label, color=colour, alpha=0.8)
        if measured and layout in measured:
            got = list(measured[layout])
            m = sum(got) / len(got)
            bars.scatter(xs, [g / m for g in got], marker="_", s=300, color="black", zorder=3)
    bars.axhline(1, color="gray", ls="--", lw=0.8)
    bars.set_xticks(range(world_size), [f"rank {r}" for r in range(world_size)])
    bars.set_ylabel("work / mean (— measured)")
    bars.legend(fontsize=8)
    bars.set_title("causal work per rank")
    if title:
        fig.suptitle(title)
    return fig
