"""Tests for labkit/viz/training.py: schedule and loss figures drawn headless from known data."""

from __future__ import annotations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from labkit.optim import lr_factor
from labkit.viz.training import _smooth, loss_curves, lr_schedule


def test_lr_schedule_draws_each_curve_and_the_warmup_end() -> None:
    warm = [0.1 * lr_factor(s, 4.0, 5) for s in range(12)]
    fig = lr_schedule({"k=4, warmup": warm, "k=1": [0.1] * 12}, warmup_steps=5, steps_per_epoch=3)
    assert isinstance(fig, Figure)
    (ax,) = [a for a in fig.axes if a.get_xlabel() == "optimizer step"]
    lines = ax.get_lines()
    assert list(lines[0].get_ydata()) == pytest.approx(warm)
    assert list(lines[1].get_ydata()) == pytest.approx([0.1] * 12)
    assert list(lines[2].get_xdata()) == [5, 5]  # the dotted end-of-warmup line
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == ["k=4, warmup", "k=1"]
    FigureCanvasAgg(fig).draw()
    with pytest.raises(ValueError, match="at least one curve"):
        lr_schedule({})


def test_loss_curves_plots_the_moving_average_on_a_log_axis() -> None:
    assert _smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    fig = loss_curves({"fp32": [2.0, 1.0, 0.5], "bf16": [2.0, 1.1, 0.4]}, window=1)
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    assert list(ax.get_lines()[1].get_ydata()) == pytest.approx([2.0, 1.1, 0.4])
    FigureCanvasAgg(fig).draw()
    with pytest.raises(ValueError):
        loss_curves({"a": [1.0]}, window=0)


def test_loss_curves_difference_panel_against_a_reference() -> None:
    fig = loss_curves({"fp32": [2.0, 1.0], "bf16": [2.5, 0.5]}, window=1, reference="fp32")
    loss_ax, diff_ax = fig.axes
    (diff,) = [ln for ln in diff_ax.get_lines() if ln.get_label() == "bf16"]
    assert list(diff.get_ydata()) == pytest.approx([0.5, -0.5])
    assert diff_ax.get_ylabel() == "difference from fp32"
    FigureCanvasAgg(fig).draw()
    with pytest.raises(ValueError, match="not one of"):
        loss_curves({"a": [1.0]}, reference="b")
