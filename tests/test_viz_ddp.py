"""Tests for labkit/viz/ddp.py: the bucket-size sweep and comm-hook figures, drawn headless."""

from __future__ import annotations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import labkit as lk

CAPS = [0.5, 1.0, 4.0, 25.0]


def test_bucket_size_sweep_plots_ms_per_label_with_dashed_model() -> None:
    fig = lk.viz.bucket_size_sweep(
        CAPS,
        {"gloo": [0.2, 0.15, 0.18, 0.3], "simulated": [0.1, 0.09, 0.12, 0.2]},
        predicted_s={"simulated": [0.1, 0.1, 0.1, 0.2]},
        n_buckets=[16, 8, 2, 1],
        title="sweep",
    )
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    gloo, sim, model = ax.get_lines()
    assert list(gloo.get_xdata()) == CAPS
    assert list(gloo.get_ydata()) == pytest.approx([200, 150, 180, 300])
    assert model.get_linestyle() == "--" and model.get_color() == sim.get_color()
    assert ax.get_xscale() == "log" and ax.get_title() == "sweep"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.5", "1", "4", "25"]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["gloo (measured)", "simulated (measured)", "simulated (model)"]
    top = [c for c in ax.child_axes][0]
    assert [t.get_text() for t in top.get_xticklabels()] == ["16", "8", "2", "1"]
    FigureCanvasAgg(fig).draw()


def test_bucket_size_sweep_rejects_mismatched_series() -> None:
    with pytest.raises(ValueError, match="3 values for 4 caps"):
        lk.viz.bucket_size_sweep(CAPS, {"gloo": [1, 2, 3]})
    with pytest.raises(ValueError, match="caps > 0"):
        lk.viz.bucket_size_sweep([0, 1], {"gloo": [1, 2]})
    with pytest.raises(ValueError, match="bucket counts"):
        lk.viz.bucket_size_sweep([1, 2], {"gloo": [1, 2]}, n_buckets=[1])


def test_comm_hook_tradeoff_bars_and_fractions_of_the_baseline() -> None:
    names = ["allreduce", "fp16", "PowerSGD r=1"]
    fig = lk.viz.comm_hook_tradeoff(names, [68904, 34452, 6890], [0.95, 0.95, 0.9])
    left, right = fig.axes
    assert [p.get_height() for p in left.patches] == pytest.approx([68.904, 34.452, 6.89])
    assert [t.get_text() for t in left.texts] == ["100%", "50%", "10%"]
    assert [p.get_height() for p in right.patches] == pytest.approx([95, 95, 90])
    assert [t.get_text() for t in right.texts] == ["95.0%", "95.0%", "90.0%"]
    assert [t.get_text() for t in right.get_xticklabels()] == names
    FigureCanvasAgg(fig).draw()


def test_comm_hook_tradeoff_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="one entry per hook"):
        lk.viz.comm_hook_tradeoff(["a", "b"], [1], [0.5, 0.5])
    with pytest.raises(ValueError, match="baseline"):
        lk.viz.comm_hook_tradeoff(["a"], [0], [0.5])
