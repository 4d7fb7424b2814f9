"""The model-split memory figure stacks the measured bytes and marks the model's totals."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

import labkit as lk
from labkit.parallel.model_split import StageMemory


def test_bars_stack_to_each_stage_total():
    rows = [StageMemory(1000, 1000, 2000, 500), StageMemory(3000, 3000, 6000, 100)]
    model = [StageMemory(1000, 1000, 2000, 400), StageMemory(3000, 3000, 6000, 100)]
    fig = lk.viz.stage_memory({"even": rows, "uneven": rows[::-1]}, {"even": model})
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert len(ax.patches) == 4 * len(rows)  # params, grads, optimizer, activations
    tops = [0.0] * len(rows)
    for i, bar in enumerate(ax.patches):
        tops[i % len(rows)] = max(tops[i % len(rows)], bar.get_y() + bar.get_height())
    assert tops == pytest.approx([r.total_bytes / 1e3 for r in rows])
    marks = ax.collections[0].get_offsets()
    assert [float(y) for _, y in marks] == pytest.approx([m.total_bytes / 1e3 for m in model])
    assert "12.1 kB" in ax.get_title()
    assert not fig.axes[1].collections  # no model given for "uneven"


def test_no_splits():
    with pytest.raises(ValueError, match="at least one split"):
        lk.viz.stage_memory({})
