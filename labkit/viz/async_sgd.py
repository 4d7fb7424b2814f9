"""Figures for synchronous vs asynchronous SGD: loss curves and the staleness histogram.

Introduced in notebooks/08_sync_vs_async.ipynb.

- ``sgd_loss_curves``: evaluation loss against wall time and against updates, one line per run,
  one colour per method (sync, async, local), solid then dashed for a method's second run
  (e.g. with a straggler).
- ``staleness_histogram``: how many updates each staleness value had, per asynchronous run.

Runs are read by attribute (``method``, ``initial_loss``, ``wall_s``, ``update``, ``loss``,
``staleness``), i.e. ``lk.parallel.async_sgd.TrainLog``. Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from matplotlib.figure import Figure

__all__ = ["sgd_loss_curves", "staleness_histogram"]

_METHOD_COLORS = {"sync": "#1f77b4", "async": "#d62728", "local": "#2ca02c"}
_OTHER = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
_STYLES = ("-", "--", ":", "-.")


def _points(log: Any, x: str) -> tuple[list[float], list[float]]:
    xs = [0.0] + [float(v) for v in (log.wall_s if x == "wall" else log.update)]
    ys = [log.initial_loss, *log.loss]
    keep = [(a, b) for a, b in zip(xs, ys, strict=True) if not math.isnan(b)]
    return [a for a, _ in keep], [b for _, b in keep]


def sgd_loss_curves(runs: Mapping[str, Any], title: str = "", log_y: bool = True) -> Figure:
    """Evaluation loss against wall time (left) and against updates (right), one line per run.

    Args:
        runs: label → the rank-0 ``TrainLog`` of a run.
        title: the figure's title.
        log_y: logarithmic loss axis.

    Returns:
        A ``Figure`` with two axes.

    Raises:
        ValueError: ``runs`` is empty or a run has no rows.
    """
    if not runs or any(not log.update for log in runs.values()):
        raise ValueError("sgd_loss_curves needs at least one run, each with logged updates")
    fig = Figure(figsize=(11, 4), layout="constrained")
    ax_t, ax_u = fig.subplots(1, 2, sharey=True)
    seen: Counter[str] = Counter()
    for i, (label, log) in enumerate(runs.items()):
        color = _METHOD_COLORS.get(log.method, _OTHER[i % len(_OTHER)])
        style = _STYLES[seen[log.method] % len(_STYLES)]
        seen[log.method] += 1
        for ax, x in ((ax_t, "wall"), (ax_u, "update")):
            xs, ys = _points(log, x)
            ax.plot(xs, ys, style, color=color, label=label, marker="." if len(xs) < 30 else None)
    ax_t.set_xlabel("wall time (s)")
    ax_u.set_xlabel("updates applied (optimizer steps)")
    ax_t.set_ylabel("loss on the evaluation set")
    for ax in (ax_t, ax_u):
        if log_y:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    ax_u.legend(fontsize="small")
    fig.suptitle(title or "loss against wall time and against updates")
    return fig


def staleness_histogram(runs: Mapping[str, Any], title: str = "") -> Figure:
    """Bars: the share of updates with each staleness, side by side per run; mean in the legend.

    Args:
        runs: label → a ``TrainLog`` with ``staleness`` per update (asynchronous runs).
        title: the figure's title.

    Returns:
        A ``Figure`` with one axis.

    Raises:
        ValueError: ``runs`` is empty or a run has no staleness values.
    """
    if not runs or any(not log.staleness for log in runs.values()):
        raise ValueError("staleness_histogram needs at least one run with staleness values")
    fig = Figure(figsize=(7, 3.5), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(runs)
    top = max(max(log.staleness) for log in runs.values())
    for i, (label, log) in enumerate(runs.items()):
        counts = Counter(log.staleness)
        n = len(log.staleness)
        xs = [s + (i - (len(runs) - 1) / 2) * width for s in range(top + 1)]
        mean = sum(log.staleness) / n
        ax.bar(
            xs,
            [counts.get(s, 0) / n for s in range(top + 1)],
            width=width,
            color=_OTHER[i % len(_OTHER)] if i else _METHOD_COLORS["async"],
            label=f"{label} (mean {mean:.2f})",
        )
    ax.set_xticks(range(top + 1))
    ax.set_xlabel("staleness = server version − gradient version")
    ax.set_ylabel("share of updates")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(title or "staleness of the applied gradients")
    return fig
