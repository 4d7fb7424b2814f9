"""Tests for labkit/viz/p2p.py: the latency/bandwidth figure, drawn headless from known rows."""

from __future__ import annotations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import labkit as lk
from labkit.bench import AlphaBeta, BenchResult, message_sizes

ALPHA, BETA = 100e-6, 1 / 2e9  # 100 µs, 2 GB/s: n½ = 200 kB


def _rows(sizes: list[int]) -> list[BenchResult]:
    rows = []
    for n in sizes:
        t = ALPHA + n * BETA
        rows.append(BenchResult("p2p", n, t, n / t / 1e9, n / t / 1e9, 2, "gloo", "cpu", 5))
    return rows


def test_points_and_axes() -> None:
    rows = _rows(message_sizes(1, 1 << 24, 4))
    fig = lk.viz.p2p_latency_bandwidth(list(reversed(rows)))  # any order in, sorted out
    assert isinstance(fig, Figure)
    ax_t, ax_bw = fig.axes
    for ax in (ax_t, ax_bw):
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    (t_line,) = ax_t.get_lines()
    (bw_line,) = ax_bw.get_lines()
    assert list(t_line.get_xdata()) == [r.n_bytes for r in rows]
    assert list(t_line.get_ydata()) == pytest.approx([r.time_s * 1e6 for r in rows])
    assert list(bw_line.get_ydata()) == pytest.approx([r.algbw_gbps for r in rows])
    assert "µs" in ax_t.get_ylabel() and "GB/s" in ax_bw.get_ylabel()
    assert "gloo" in fig._suptitle.get_text()
    FigureCanvasAgg(fig).draw()  # renders without a display


def test_fit_curves_asymptote_and_n_half() -> None:
    rows = _rows(message_sizes(1, 1 << 24, 4))
    fig = lk.viz.p2p_latency_bandwidth(rows, AlphaBeta(ALPHA, BETA), title="mine")
    ax_t, ax_bw = fig.axes
    model_t = ax_t.get_lines()[1]
    assert model_t.get_ydata()[0] == pytest.approx((ALPHA + BETA) * 1e6)  # grid starts at 1 B
    _, model_bw, peak, n_half = ax_bw.get_lines()
    assert list(peak.get_ydata()) == pytest.approx([2.0, 2.0])  # 1/β in GB/s
    assert list(n_half.get_xdata()) == pytest.approx([ALPHA / BETA] * 2)
    assert max(model_bw.get_ydata()) < 2.0  # n / (α + nβ) stays under 1/β
    labels = [t.get_text() for t in ax_bw.get_legend().get_texts()]
    assert any("1/β = 2.00 GB/s" in s for s in labels) and any("n½" in s for s in labels)
    assert fig._suptitle.get_text() == "mine"
    FigureCanvasAgg(fig).draw()


def test_minimum_drawn_when_samples_differ() -> None:
    rows = []
    for n in (1, 1024, 1 << 20):
        t = ALPHA + n * BETA
        samples = (t, 3 * t, 2 * t)
        rows.append(
            BenchResult("p2p", n, 2 * t, n / t / 2e9, n / t / 2e9, 2, "gloo", "cpu", 3, samples)
        )
    ax_t, ax_bw = lk.viz.p2p_latency_bandwidth(rows).axes
    median, minimum = ax_t.get_lines()
    assert list(median.get_ydata()) == pytest.approx([2 * r.time_min_s * 1e6 for r in rows])
    assert list(minimum.get_ydata()) == pytest.approx([r.time_min_s * 1e6 for r in rows])
    assert minimum.get_label() == "min" and median.get_label() == "median"
    bw_min = ax_bw.get_lines()[1].get_ydata()
    assert list(bw_min) == pytest.approx([r.n_bytes / r.time_min_s / 1e9 for r in rows])


def test_n_half_outside_the_sizes_is_not_drawn() -> None:
    rows = _rows([1, 2, 4])  # n½ = 200 kB lies far right of 4 B
    fig = lk.viz.p2p_latency_bandwidth(rows, AlphaBeta(ALPHA, BETA))
    assert len(fig.axes[1].get_lines()) == 3  # points, model, 1/β


def test_empty_results_raise() -> None:
    with pytest.raises(ValueError, match="at least one"):
        lk.viz.p2p_latency_bandwidth([])
