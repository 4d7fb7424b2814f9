"""Tests for labkit/viz/cost.py: the cost-model figures, drawn headless from known rows."""

from __future__ import annotations

from dataclasses import replace

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import labkit as lk
from labkit.bench import BenchResult
from labkit.costmodel import Network, busbw_factor, crossover_bytes, predict

NET = Network(latency_us=100.0, bandwidth_gbps=2.0, name="fake")
SIZES = [8, 1024, 1 << 16, 1 << 20]


def _rows(op: str, p: int, slowdown: float = 1.0) -> list[BenchResult]:
    rows = []
    for n in SIZES:
        t = predict(op, n, p, NET) * slowdown
        alg = n / t / 1e9
        bus = alg * busbw_factor(op, p)
        rows.append(BenchResult(op, n, t, alg, bus, p, "gloo", "cpu", 3))
    return rows


def test_predicted_vs_measured_ratio_is_measured_over_model() -> None:
    fig = lk.viz.predicted_vs_measured(
        {"exact": (_rows("all_reduce", 4), NET), "slow": (_rows("all_reduce", 4, 2.0), NET)}
    )
    assert isinstance(fig, Figure)
    ax_t, ax_r = fig.axes
    points, model, *_ = ax_t.get_lines()
    assert list(points.get_xdata()) == SIZES
    assert list(points.get_ydata()) == pytest.approx(
        [r.time_s * 1e6 for r in _rows("all_reduce", 4)]
    )
    assert model.get_ydata()[0] == pytest.approx(predict("all_reduce", 8, 4, NET) * 1e6)
    ratio_exact, ratio_slow = (ln for ln in ax_r.get_lines() if len(ln.get_xdata()) == 4)
    assert list(ratio_exact.get_ydata()) == pytest.approx([1.0] * 4)
    assert list(ratio_slow.get_ydata()) == pytest.approx([2.0] * 4)
    assert "all_reduce on 4 ranks" in fig._suptitle.get_text()
    FigureCanvasAgg(fig).draw()


def test_predicted_vs_measured_on_the_fastest_samples() -> None:
    rows = [replace(r, times_s=(r.time_s, r.time_s / 4)) for r in _rows("broadcast", 2)]
    fig = lk.viz.predicted_vs_measured({"min": (rows, NET)}, stat="min")
    ratio = next(ln for ln in fig.axes[1].get_lines() if len(ln.get_xdata()) == 4)
    assert list(ratio.get_ydata()) == pytest.approx([0.25] * 4)
    assert "measured min" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match="stat"):
        lk.viz.predicted_vs_measured({"min": (rows, NET)}, stat="mean")


def test_algbw_busbw_panels() -> None:
    rows = {f"p={p}": _rows("all_reduce", p) for p in (2, 8)}
    fig = lk.viz.algbw_busbw(rows)
    ax_a, ax_b = fig.axes
    for ax, attr in ((ax_a, "algbw_gbps"), (ax_b, "busbw_gbps")):
        for line, series in zip(ax.get_lines(), rows.values(), strict=True):
            assert list(line.get_ydata()) == pytest.approx([getattr(r, attr) for r in series])
    FigureCanvasAgg(fig).draw()


def test_what_if_scaling_and_crossover() -> None:
    ranks = [2, 16, 128, 1024]
    fig = lk.viz.what_if_scaling("all_reduce", 1 << 20, ranks, NET, ["ring", "tree"])
    ring, tree = fig.axes[0].get_lines()
    assert list(ring.get_ydata()) == pytest.approx(
        [predict("all_reduce", 1 << 20, p, NET, "ring") for p in ranks]
    )
    assert ring.get_label() == "ring" and tree.get_label() == "binomial tree (unpipelined)"
    fig = lk.viz.algorithm_crossover("all_reduce", 8, NET, "recursive_doubling", "ring")
    n_star = crossover_bytes("all_reduce", 8, NET, "recursive_doubling", "ring")
    marker = [ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("n* =")]
    assert len(marker) == 1 and marker[0].get_xdata()[0] == pytest.approx(n_star)
    FigureCanvasAgg(fig).draw()


def test_empty_input_is_refused() -> None:
    with pytest.raises(ValueError):
        lk.viz.predicted_vs_measured({})
    with pytest.raises(ValueError):
        lk.viz.algbw_busbw({"p=2": []})
    with pytest.raises(ValueError):
        lk.viz.what_if_scaling("all_reduce", 8, [], NET)
