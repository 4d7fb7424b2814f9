"""Tests for labkit/viz/fault_tolerance.py: the resume timeline drawn headless from known data."""

from __future__ import annotations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import labkit as lk
from labkit.viz.fault_tolerance import resume_timeline


def test_resume_timeline_draws_both_runs_the_lost_span_and_checkpoints() -> None:
    ref = [2.0, 1.5, 1.2, 1.0, 0.9, 0.8]
    fig = resume_timeline(ref, ref[2:], resumed_from=2, checkpoint_steps=[2, 4], kill_at=3)
    assert isinstance(fig, Figure)
    assert lk.viz.resume_timeline is resume_timeline
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert list(lines[0].get_xdata()) == [1, 2, 3, 4, 5, 6]
    assert list(lines[1].get_xdata()) == [3, 4, 5, 6]
    assert list(lines[1].get_ydata()) == ref[2:]
    assert [list(line.get_xdata()) for line in lines[2:]] == [[3, 3], [2, 2], [4, 4]]
    (span,) = ax.patches
    assert span.get_x() == 2 and span.get_width() == 1
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [
        "uninterrupted run",
        "resumed run",
        "work lost to the kill",
        "SIGKILL after step 3",
        "checkpoint",
    ]
    FigureCanvasAgg(fig).draw()


def test_resume_timeline_refuses_impossible_input() -> None:
    with pytest.raises(ValueError, match="uninterrupted"):
        resume_timeline([], [], 0, [], 1)
    with pytest.raises(ValueError, match="after the kill"):
        resume_timeline([1.0], [], 5, [], 3)
