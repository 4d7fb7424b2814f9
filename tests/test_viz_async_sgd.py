"""Tests for labkit/viz/async_sgd.py: loss curves and the staleness histogram, from known logs."""

from __future__ import annotations

import math

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import labkit as lk
from labkit.parallel.sgd_problem import TrainLog


def _log(method: str, staleness: list[int], evaluated_every: int = 1) -> TrainLog:
    n = len(staleness)
    log = TrainLog(method, 0, 3, 2, initial_loss=2.0)
    log.update = list(range(1, n + 1))
    log.wall_s = [0.1 * u for u in log.update]
    log.loss = [2.0 / (1 + u) if u % evaluated_every == 0 else math.nan for u in log.update]
    log.staleness = staleness
    return log


def test_loss_curves_one_line_per_run_and_axis() -> None:
    runs = {
        "sync": _log("sync", [0] * 4),
        "async": _log("async", [0, 1, 1, 1, 1, 1], evaluated_every=2),
        "async, straggler": _log("async", [0, 1, 2, 0]),
    }
    fig = lk.viz.sgd_loss_curves(runs, title="t")
    assert isinstance(fig, Figure)
    ax_t, ax_u = fig.axes
    assert [line.get_label() for line in ax_u.get_lines()] == list(runs)
    sync_t, async_t, strag_t = ax_t.get_lines()
    assert list(sync_t.get_xdata()) == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    assert list(sync_t.get_ydata()) == pytest.approx([2.0, 1.0, 2 / 3, 0.5, 0.4])
    # Updates not evaluated (NaN) are skipped; the initial loss is the point at 0.
    assert list(ax_u.get_lines()[1].get_xdata()) == [0, 2, 4, 6]
    assert async_t.get_color() == strag_t.get_color() != sync_t.get_color()
    assert async_t.get_linestyle() == "-" and strag_t.get_linestyle() == "--"
    assert ax_t.get_yscale() == "log" and "wall" in ax_t.get_xlabel()
    FigureCanvasAgg(fig).draw()


def test_staleness_histogram_shares_and_means() -> None:
    runs = {"a": _log("async", [0, 1, 1, 3]), "b": _log("async", [2, 2])}
    fig = lk.viz.staleness_histogram(runs)
    (ax,) = fig.axes
    bars_a, bars_b = ax.containers
    assert [b.get_height() for b in bars_a] == pytest.approx([0.25, 0.5, 0.0, 0.25])
    assert [b.get_height() for b in bars_b] == pytest.approx([0.0, 0.0, 1.0, 0.0])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["a (mean 1.25)", "b (mean 2.00)"]
    FigureCanvasAgg(fig).draw()


def test_empty_input_is_an_error() -> None:
    with pytest.raises(ValueError):
        lk.viz.sgd_loss_curves({})
    with pytest.raises(ValueError):
        lk.viz.staleness_histogram({"x": _log("async", [])})
