"""The ZeRO memory figure draws labkit.memory's numbers."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

import labkit as lk
from labkit import memory


def test_bars_stack_to_the_model_totals():
    bds = [memory.zero_memory(7.5e9, 64, s) for s in memory.STAGES]
    fig = lk.viz.zero_memory_breakdown(bds, highlight=2, device_gb=32)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    bars = [p for p in ax.patches if p.get_fill()]
    assert len(bars) == 3 * len(bds)  # params, grads, optimizer per stage
    tops = [0.0] * len(bds)
    for i, bar in enumerate(bars):
        tops[i % len(bds)] = max(tops[i % len(bds)], bar.get_y() + bar.get_height())
    assert tops == pytest.approx([b.total_gb for b in bds])
    params = [bar.get_height() for bar in bars[: len(bds)]]
    assert params == pytest.approx([b.params_bytes / memory.GB for b in bds])
    outlines = [p for p in ax.patches if not p.get_fill()]
    assert len(outlines) == 1 and outlines[0].get_height() == pytest.approx(bds[2].total_gb)
    assert any(line.get_ydata()[0] == 32 for line in ax.get_lines())


def test_no_breakdowns():
    with pytest.raises(ValueError, match="at least one"):
        lk.viz.zero_memory_breakdown([])


def test_ring_step_figure_and_cost_sweep():
    from labkit.collectives.ring_trace import trace_ring_allreduce

    trace = trace_ring_allreduce([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    fig = lk.viz.ring_allreduce_step(trace, 1)
    assert isinstance(fig, Figure)
    assert "reduce-scatter step 1 of 1" in fig.get_suptitle()
    with pytest.raises(ValueError, match="frame"):
        lk.viz.ring_allreduce_step(trace, 3)
    net = lk.Network.preset("10GbE")
    fig = lk.viz.predicted_time_sweep("all_reduce", 8, net, ["ring"], mark_bytes=1024)
    line = fig.axes[0].get_lines()[0]
    x, y = line.get_xdata()[5], line.get_ydata()[5]
    assert y == lk.costmodel.predict("all_reduce", x, 8, net, "ring")
    with pytest.raises(ValueError, match="algorithm"):
        lk.viz.predicted_time_sweep("all_reduce", 8, net, [])
