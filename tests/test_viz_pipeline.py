"""Tests for labkit/viz/pipeline.py: figures built headless from schedules and spans."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

import labkit as lk
from labkit.parallel.pipeline import gpipe, interleaved_one_f_one_b
from labkit.trace import Span, Timeline


def _texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_schedule_grid_labels_every_action() -> None:
    s = gpipe(2, 3)
    fig = lk.viz.schedule_grid(s)
    assert isinstance(fig, Figure)
    assert sorted(_texts(fig)) == sorted(str(a) for row in s for a in row if a is not None)
    assert "2 ranks, 8 slots, 4 idle rank-slots" in fig.axes[0].get_title()
    with pytest.raises(ValueError):
        lk.viz.schedule_grid([])


def _spans(schedule, slot_ns: int = 1_000_000) -> list[list[Span]]:
    out = []
    for r, row in enumerate(schedule):
        spans = [
            Span(str(a), "compute", t * slot_ns, (t + 1) * slot_ns, r,
                 {"stage": a.stage, "op": a.op, "microbatch": a.microbatch})
            for t, a in enumerate(row) if a is not None
        ]  # fmt: skip
        spans.append(Span("recv", "comm", 0, slot_ns // 2, r, {}))
        out.append(spans)
    return out


def test_schedule_vs_timeline_draws_both_panels() -> None:
    s = interleaved_one_f_one_b(2, 2, 2)
    tl = Timeline.merge(_spans(s))
    fig = lk.viz.schedule_vs_timeline(s, tl, title="interleaved")
    assert len(fig.axes) == 2
    left, right = fig.axes
    n_actions = sum(a is not None for row in s for a in row)
    assert len(left.texts) == n_actions == len(right.texts)
    assert right.get_xlim()[1] == pytest.approx(len(s[0]))  # ms: one per slot
    # spans laid out exactly like the slots: the measured bubble equals the planned one
    assert lk.parallel.pipeline.measured_bubble_fraction(tl) == pytest.approx(
        lk.parallel.pipeline.bubble_fraction(s)
    )
    with pytest.raises(ValueError, match="ranks"):
        lk.viz.schedule_vs_timeline(gpipe(3, 1), tl)
