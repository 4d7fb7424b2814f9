"""The activation figure stacks labkit.memory's terms per case and marks the measured totals."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

import labkit as lk


def test_bars_stack_to_the_model_and_mark_the_measured_totals():
    terms = lk.memory.block_activation_terms
    cases = {
        "unsplit": terms(16, 2, 32, 4),
        "TP": terms(16, 2, 32, 4, tensor_parallel=4),
        "SP": terms(16, 2, 32, 4, tensor_parallel=4, sequence_parallel=True),
    }
    fig = lk.viz.activation_terms(cases, {"TP": 1000.0, "SP": 2000.0})
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    bars = [b for b in ax.patches if b.get_height() > 0]
    assert len(bars) == sum(len(t) for t in cases.values())
    tops: dict[float, float] = {}
    for bar in bars:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    assert [tops[x] for x in range(3)] == pytest.approx(
        [sum(t.values()) / 1e3 for t in cases.values()]
    )
    marks = ax.collections[0].get_offsets()
    assert [tuple(map(float, m)) for m in marks] == [(1.0, 1.0), (2.0, 2.0)]
    with pytest.raises(ValueError, match="at least one case"):
        lk.viz.activation_terms({})
