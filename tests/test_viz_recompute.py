"""The recomputation figure draws labkit.memory's terms and FLOPs, with measured ticks."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

import labkit as lk
from labkit import memory

MODES = memory.RECOMPUTE_MODES


def test_bars_stack_to_the_model_and_ticks_are_the_measurements():
    kept = {m: memory.block_activation_terms(8, 2, 16, 4, recompute=m) for m in MODES}
    flops = {m: memory.block_flops(8, 2, 16, recompute=m) for m in MODES}
    measured = {m: sum(t.values()) for m, t in kept.items()}
    fig = lk.viz.recompute_tradeoff(kept, flops, measured, {"full": 1.5e6})
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    left, right = fig.axes
    tops = [0.0] * 3
    for bar in left.patches:
        i = round(bar.get_x() + bar.get_width() / 2)
        tops[i] = max(tops[i], bar.get_y() + bar.get_height())
    assert tops == pytest.approx([measured[m] / 1e3 for m in MODES])
    (ticks,) = left.collections
    assert list(ticks.get_offsets()[:, 1]) == pytest.approx(tops)
    heights = [b.get_y() + b.get_height() for b in right.patches]
    want = [(f["forward"] + f["backward"] + f["recompute"]) / 1e6 for f in flops.values()]
    assert max(heights) == pytest.approx(max(want))
    (one,) = right.collections
    assert list(one.get_offsets()[0]) == pytest.approx([2, 1.5])
    assert [t.get_text() for t in left.get_xticklabels()] == list(MODES)


def test_modes_must_agree():
    with pytest.raises(ValueError, match="same modes"):
        lk.viz.recompute_tradeoff({"none": {"x": 1.0}}, {"full": {"forward": 1.0}})
    with pytest.raises(ValueError, match="same modes"):
        lk.viz.recompute_tradeoff({}, {})
