"""Tests for labkit/viz/algorithms.py: figures drawn headless from known messages and times."""

from __future__ import annotations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Annotation

import labkit as lk
from labkit.collectives import CommStats, Message, expected_bytes, expected_messages


def _ring_messages(p: int, numel: int) -> list[list[Message]]:
    """What a ring all-reduce records on each rank (the phases and peers of allreduce_ring)."""
    out = []
    for r in range(p):
        msgs = []
        for phase in ("reduce-scatter", "all-gather"):
            for s in range(p - 1):
                msgs.append(Message("send", (r + 1) % p, numel, 4 * numel, phase, s))
                msgs.append(Message("recv", (r - 1) % p, numel, 4 * numel, phase, s))
        out.append(msgs)
    return out


def _arrows(fig: Figure) -> list[Annotation]:
    return [c for c in fig.axes[0].get_children() if isinstance(c, Annotation)]


def test_message_diagram_one_arrow_per_send_in_its_step() -> None:
    p = 4
    fig = lk.viz.message_diagram(_ring_messages(p, 5), title="ring")
    assert isinstance(fig, Figure)
    arrows = _arrows(fig)
    assert len(arrows) == 2 * p * (p - 1)
    # Rank 3's sends wrap around to rank 0: tail on rank 3's line, head on rank 0's.
    wrap = [a for a in arrows if a.xyann[1] == -3]
    assert {a.xy[1] for a in wrap} == {0}
    assert sorted(round(a.xyann[0] - 0.15) for a in wrap) == list(range(2 * (p - 1)))
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {"reduce-scatter", "all-gather", "5"} <= texts
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [f"rank {r}" for r in range(p)]
    FigureCanvasAgg(fig).draw()


def test_message_diagram_orders_steps_across_ranks() -> None:
    # Recursive doubling on 3 ranks: rank 0 only folds and unfolds, yet "unfold" comes last.
    fold, unfold = ("fold", 0), ("unfold", 0)
    logs = [
        [Message("send", 1, 2, 8, *fold), Message("recv", 1, 2, 8, *unfold)],
        [
            Message("recv", 0, 2, 8, *fold),
            Message("send", 2, 2, 8, "exchange", 0),
            Message("recv", 2, 2, 8, "exchange", 0),
            Message("send", 0, 2, 8, *unfold),
        ],
        [Message("send", 1, 2, 8, "exchange", 0), Message("recv", 1, 2, 8, "exchange", 0)],
    ]
    stats = [CommStats(r, 3, m) for r, m in enumerate(logs)]  # CommStats work as entries too
    fig = lk.viz.message_diagram(stats, show_sizes=False)
    phases = [t.get_text() for t in fig.axes[0].texts if not isinstance(t, Annotation)]
    assert phases == ["fold", "exchange", "unfold"]
    unfold_arrow = next(a for a in _arrows(fig) if a.xyann[1] == -1 and a.xy[1] == 0)
    assert unfold_arrow.xyann[0] == pytest.approx(2.15)  # the third column
    assert "3 ranks: 4 messages in 3 steps" in fig._suptitle.get_text()


def test_message_diagram_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="one entry per rank"):
        lk.viz.message_diagram([])
    with pytest.raises(ValueError, match="outside range"):
        lk.viz.message_diagram([[Message("send", 5, 1, 4, "x", 0)], []])


def test_traffic_per_rank_bars_and_formula_marks() -> None:
    p, n = 5, 10
    expected = {
        alg: [
            {
                "messages_sent": expected_messages(alg, p, r),
                "bytes_sent": expected_bytes(alg, p, n, 4, r),
            }
            for r in range(p)
        ]
        for alg in ("naive", "ring")
    }
    fig = lk.viz.traffic_per_rank(expected, expected)
    ax_m, ax_b = fig.axes
    heights = [b.get_height() for b in ax_m.patches]
    assert heights == [4, 1, 1, 1, 1] + [8] * p  # naive: rank 0 serves everyone
    assert [b.get_height() for b in ax_b.patches][:p] == [160, 40, 40, 40, 40]
    marks = ax_b.collections[1].get_offsets()[:, 1].tolist()  # the ring's formula ticks
    assert marks == [expected_bytes("ring", p, n, 4, r) for r in range(p)]
    FigureCanvasAgg(fig).draw()
    with pytest.raises(ValueError):
        lk.viz.traffic_per_rank({})
    with pytest.raises(ValueError, match="same ranks"):
        lk.viz.traffic_per_rank({"a": [expected["ring"][0]], "b": expected["ring"]})


def test_allreduce_times_lines_and_ratios() -> None:
    sizes = [4, 4096, 1 << 20]
    times = {"ring": [2e-3, 3e-3, 8e-3], "dist.all_reduce": [1e-3, 3e-3, 16e-3]}
    fig = lk.viz.allreduce_times(sizes, times)
    ax_t, ax_r = fig.axes
    ring_t, ref_t = ax_t.get_lines()
    assert list(ring_t.get_ydata()) == pytest.approx([2.0, 3.0, 8.0])  # ms
    assert list(ref_t.get_ydata()) == pytest.approx([1.0, 3.0, 16.0])
    assert list(ax_r.get_lines()[0].get_ydata()) == pytest.approx([2.0, 1.0, 0.5])
    assert ax_t.get_xscale() == "log" and ax_r.get_yscale() == "log"
    FigureCanvasAgg(fig).draw()
    with pytest.raises(ValueError, match="reference"):
        lk.viz.allreduce_times(sizes, {"ring": times["ring"]})
    with pytest.raises(ValueError, match="one time per size"):
        lk.viz.allreduce_times(sizes[:2], times)
