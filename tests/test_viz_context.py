"""The causal-work figure draws each layout's blocks per rank and the work per rank."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

import labkit as lk


@pytest.mark.parametrize("p", [2, 4])
def test_grids_cover_the_causal_mask_and_bars_the_counted_work(p):
    measured = {"contiguous": [1.0 + r for r in range(p)], "zigzag": [5.0] * p}
    fig = lk.viz.causal_work(p, measured)
    assert isinstance(fig, Figure)
    n = 2 * p  # chunks drawn: 2p for both layouts
    for ax in fig.axes[:2]:  # full blocks below the diagonal, triangles on it
        assert len(ax.patches) == n * (n - 1) // 2 + n
    bars = fig.axes[2]
    heights = [b.get_height() for b in bars.patches]
    contiguous = lk.parallel.context.work_per_rank(p, "contiguous")
    mean = sum(contiguous) / p
    assert heights[:p] == pytest.approx([w / mean for w in contiguous])
    assert heights[p:] == pytest.approx([1.0] * p)  # zig-zag: balanced
    marks = [float(y) for _, y in bars.collections[1].get_offsets()]
    assert marks == pytest.approx([1.0] * p)  # the measured zig-zag work, over its mean
    with pytest.raises(ValueError, match="world_size"):
        lk.viz.causal_work(0)
