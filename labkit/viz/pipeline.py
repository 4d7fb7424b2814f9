"""Pipeline schedules drawn as grids, next to the timeline the runtime measured.

Introduced in notebooks/11_pipeline_parallel.ipynb.

``schedule_grid(schedule)``: ranks × time slots, forwards and backwards in two colours (a
zero-bubble schedule's weight gradients ``W`` in a third), each cell labelled with its action
(``"2F0"``), bubbles left blank. ``schedule_vs_timeline``: that
grid on the left and, on the right, the per-rank spans ``labkit.parallel.pipeline.run_schedule``
recorded (``lk.trace.Timeline``), in the same colours, so the planned and the measured bubble
can be compared by eye. Reads actions and spans by their attributes; imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

__all__ = ["schedule_grid", "schedule_vs_timeline"]

COLORS = {"F": "#4c72b0", "B": "#55a868", "W": "#8172b3", "comm": "#ff7f0e", "idle": "#eeeeee"}


def _alpha(stage: int, n_ranks: int) -> float:
    """Later virtual stages (chunks) of a rank are drawn lighter."""
    return 1.0 if stage < n_ranks else 0.6


def _splits(schedule: Sequence[Sequence[Any]]) -> bool:
    return any(a is not None and a.op == "W" for row in schedule for a in row)


def _legend(fig: Figure, comm: bool = False, split: bool = False) -> None:
    handles = [
        Patch(facecolor=COLORS["F"], label="forward"),
        Patch(facecolor=COLORS["B"], label="backward (input grad)" if split else "backward"),
    ]
    if split:
        handles.append(Patch(facecolor=COLORS["W"], label="weight grad (W)"))
    handles.append(Patch(facecolor=COLORS["idle"], edgecolor="#bbbbbb", label="bubble (idle)"))
    if comm:
        handles.append(Patch(facecolor=COLORS["comm"], label="waiting for a message"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)


def _draw_grid(ax: Axes, schedule: Sequence[Sequence[Any]], labels: bool) -> None:
    n_ranks = len(schedule)
    n_slots = max((len(row) for row in schedule), default=0)
    for r, row in enumerate(schedule):
        ax.broken_barh([(0, n_slots)], (r - 0.4, 0.8), facecolors=COLORS["idle"])
        for t, a in enumerate(row):
            if a is None:
                continue
            ax.broken_barh(
                [(t, 1)],
                (r - 0.4, 0.8),
                facecolors=COLORS[a.op],
                edgecolor="white",
                linewidth=1,
                alpha=_alpha(a.stage, n_ranks),
            )
            if labels:
                fontsize = 7 if n_slots <= 30 else 5
                ax.text(t + 0.5, r, str(a), ha="center", va="center", color="white",
                        fontsize=fontsize)  # fmt: skip
    ax.set_xlim(0, max(n_slots, 1))
    ax.set_ylim(n_ranks - 0.5, -0.5)
    ax.set_yticks(range(n_ranks), [f"rank {r}" for r in range(n_ranks)])
    ax.set_xlabel("time slot (one action each)")


def schedule_grid(
    schedule: Sequence[Sequence[Any]], title: str | None = None, labels: bool = True
) -> Figure:
    """Draw a schedule: ranks × time slots, F and B coloured and labelled, bubbles blank.

    The picture of GPipe's Fig. 2 (Huang et al. 2019) and 1F1B's Fig. 4 (Narayanan et al.
    2021), from the schedule data itself.

    Args:
        schedule: per rank, one ``Action`` or ``None`` per slot.
        title: figure title (default: size and bubble share).
        labels: write each action (``"2F0"``) in its cell.

    Returns:
        matplotlib.figure.Figure: rank 0 on top.

    Raises:
        ValueError: the schedule has no ranks.
    """
    if not schedule:
        raise ValueError("the schedule has no ranks")
    n_slots = max(len(row) for row in schedule)
    fig = Figure(figsize=(min(2 + 0.35 * n_slots, 14), 1.2 + 0.5 * len(schedule)),
                 layout="constrained")  # fmt: skip
    ax = fig.add_subplot()
    _draw_grid(ax, schedule, labels)
    idle = sum(a is None for row in schedule for a in row)
    ax.set_title(title or f"{len(schedule)} ranks, {n_slots} slots, {idle} idle rank-slots")
    _legend(fig, split=_splits(schedule))
    return fig


def schedule_vs_timeline(
    schedule: Sequence[Sequence[Any]], timeline: Any, title: str | None = None
) -> Figure:
    """The planned schedule (left) next to the per-rank spans measured while running it (right).

    Args:
        schedule: per rank, one ``Action`` or ``None`` per slot.
        timeline: a ``lk.trace.Timeline`` merged from the ranks' ``lk.trace.events()`` after
            ``run_schedule``; spans with an ``"op"`` argument are actions, spans of kind
            ``"comm"`` are waits for a message.
        title: overall title (default: none).

    Returns:
        matplotlib.figure.Figure: two panels sharing the rank axis.

    Raises:
        ValueError: the schedule and the timeline have different numbers of ranks.
    """
    if len(schedule) != timeline.world_size:
        raise ValueError(f"schedule has {len(schedule)} ranks, the timeline {timeline.world_size}")
    n_ranks = len(schedule)
    fig = Figure(figsize=(14, 1.4 + 0.55 * n_ranks), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    _draw_grid(left, schedule, labels=max(len(row) for row in schedule) <= 30)
    left.set_title("planned (unit time per action)")
    end_ms = max(timeline.end_ns / 1e6, 1e-6)
    for r in range(n_ranks):
        right.broken_barh([(0, end_ms)], (r - 0.4, 0.8), facecolors=COLORS["idle"])
        for s in timeline.of_rank(r):
            x, w = s.start_ns / 1e6, max(s.duration_ns / 1e6, end_ms * 1e-4)
            if "op" in s.args:
                right.broken_barh([(x, w)], (r - 0.4, 0.8), facecolors=COLORS[s.args["op"]],
                                  edgecolor="white", linewidth=0.5,
                                  alpha=_alpha(s.args.get("stage", 0), n_ranks))  # fmt: skip
                if w > end_ms / 40:
                    right.text(x + w / 2, r, s.name, ha="center", va="center", color="white",
                               fontsize=6, clip_on=True)  # fmt: skip
            elif s.kind == "comm":
                right.broken_barh([(x, w)], (r + 0.2, 0.2), facecolors=COLORS["comm"])
    right.set_xlim(0, end_ms)
    right.set_xlabel("time (ms) from the first span")
    right.set_title("measured (lk.trace spans)")
    if title:
        fig.suptitle(title)
    _legend(fig, comm=True, split=_splits(schedule))
    return fig
