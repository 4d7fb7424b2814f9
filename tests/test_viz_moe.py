"""Tests for labkit/viz/moe.py: tokens per expert drawn headless from counts."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

import labkit as lk


def test_expert_load_draws_kept_and_dropped_per_group() -> None:
    demand = [[5, 1, 2, 0], [2, 2, 2, 2]]
    kept = [[3, 1, 2, 0], [2, 2, 2, 2]]
    fig = lk.viz.expert_load(demand, kept, capacity=3, experts_per_rank=2, title="t")
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    first = fig.axes[0]
    assert first.get_title() == "group 0: 6 kept, 2 dropped"
    heights = [p.get_height() for p in first.patches]
    assert heights == [3, 1, 2, 0, 2]  # kept bars, then the dropped part on top
    assert fig.axes[1].get_title() == "group 1: 8 kept, 0 dropped"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["capacity C", "dropped", "kept, experts of rank 0", "kept, experts of rank 1"]


@pytest.mark.parametrize(
    ("demand", "kept", "match"),
    [
        ([], [], "one row"),
        ([[1, 2]], [[1]], "one count per expert"),
        ([[1, 2]], [[2, 2]], "exceeds its demand"),
        ([[5, 2]], [[4, 2]], "or capacity 3"),
    ],
)
def test_expert_load_rejects_inconsistent_counts(demand, kept, match) -> None:
    with pytest.raises(ValueError, match=match):
        lk.viz.expert_load(demand, kept, capacity=3)
