"""Figures of the α-β cost model against measurements: time, bandwidths, scale, crossover.

Introduced in notebooks/05_communication_cost.ipynb.

- ``predicted_vs_measured``: measured time per size (points) and the model's prediction
  (lines), one colour per backend, and the ratio measured / predicted with a ±25 % band.
- ``algbw_busbw``: algbw and busbw against size, one line per world size — busbw removes
  the world-size dependence that algbw carries (nccl-tests ``doc/PERFORMANCE.md``).
- ``what_if_scaling``: predicted time against the number of ranks, per algorithm (what-if).
- ``algorithm_crossover``: two algorithms' predicted time against size, and the closed-form
  size n* where they cost the same.

Rows are read by attribute (``n_bytes``, ``time_s``, ``time_min_s``, ``algbw_gbps``,
``busbw_gbps``, ``world_size``, ``op``), e.g. ``lk.bench.BenchResult``; the model is
``labkit.costmodel`` (pure arithmetic). Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

from labkit.costmodel import ALGORITHMS, LABELS, Network, crossover_bytes, predict

__all__ = ["algbw_busbw", "algorithm_crossover", "predicted_vs_measured", "what_if_scaling"]

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def _grid(lo: float, hi: float, n: int = 120) -> list[float]:
    a, b = math.log10(max(lo, 1e-9)), math.log10(max(hi, lo * 1.0001))
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def _log_axes(ax: Any, xlabel: str, ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)


def predicted_vs_measured(
    series: Mapping[str, tuple[Sequence[Any], Network]],
    algorithm: str | None = None,
    title: str = "",
    stat: str = "median",
) -> Figure:
    """Measured time (points) and the model's prediction (lines) per size, and their ratio.

    Args:
        series: label (e.g. the backend) → (rows of one collective on one world size, the
            ``Network`` whose α and β predict them, e.g. fitted on that backend's p2p).
        algorithm: the algorithm the model assumes (default: the collective's default).
        title: the figure's title (default: names the collective and world size).
        stat: which measured time: ``"median"`` (``time_s``) or ``"min"`` (``time_min_s``,
            the fastest sample).

    Returns:
        A ``Figure`` with two axes: time (µs) against size, and measured / predicted.

    Raises:
        ValueError: ``series`` is empty, a series has no rows, or an unknown ``stat``.
    """
    if not series or any(not rows for rows, _ in series.values()):
        raise ValueError("predicted_vs_measured needs at least one series with rows")
    if stat not in ("median", "min"):
        raise ValueError(f"stat must be 'median' or 'min', got {stat!r}")

    def measured(r: Any) -> float:
        return r.time_s if stat == "median" else r.time_min_s

    fig = Figure(figsize=(11, 4), layout="constrained")
    ax_t, ax_r = fig.subplots(1, 2)
    first = next(iter(series.values()))[0][0]
    for i, (label, (rows, net)) in enumerate(series.items()):
        rows = sorted(rows, key=lambda r: r.n_bytes)
        sizes = [r.n_bytes for r in rows]
        color = _COLORS[i % len(_COLORS)]
        ax_t.plot(sizes, [measured(r) * 1e6 for r in rows], "o", color=color, label=f"{label}")
        grid = _grid(sizes[0], sizes[-1])
        op, p = rows[0].op, rows[0].world_size
        model = [predict(op, n, p, net, algorithm) * 1e6 for n in grid]
        terms = f"α = {net.latency_us:.3g} µs, 1/β = {net.bandwidth_gbps:.3g} GB/s"
        ax_t.plot(grid, model, "-", color=color, label=f"{label} model: {terms}")
        ratios = [measured(r) / predict(op, r.n_bytes, p, net, algorithm) for r in rows]
        ax_r.plot(sizes, ratios, "o-", color=color, label=label)
    ax_r.axhspan(0.75, 1.25, color="gray", alpha=0.15, label="within ±25 %")
    ax_r.axhline(1.0, color="gray", lw=1)
    _log_axes(ax_t, "size n (bytes)", "time (µs)")
    _log_axes(ax_r, "size n (bytes)", "measured / predicted")
    ax_t.legend(fontsize=7, loc="upper left")
    ax_r.legend(fontsize=7)
    ax_t.set_title(f"time: measured {stat} (points), α-β model (lines)")
    ax_r.set_title("measured / predicted")
    fig.suptitle(title or f"{first.op} on {first.world_size} ranks")
    return fig


def algbw_busbw(rows_by_label: Mapping[str, Sequence[Any]], title: str = "") -> Figure:
    """algbw and busbw against size, one line per label (e.g. per world size).

    nccl-tests ``doc/PERFORMANCE.md``: busbw = algbw · factor(p) is comparable with the
    link's peak whatever p; algbw is not.

    Args:
        rows_by_label: label → rows (``n_bytes``, ``algbw_gbps``, ``busbw_gbps``).
        title: the figure's title.

    Returns:
        A ``Figure`` with two axes: algbw and busbw (GB/s) against size.

    Raises:
        ValueError: no rows.
    """
    if not rows_by_label or any(not rows for rows in rows_by_label.values()):
        raise ValueError("algbw_busbw needs at least one non-empty series")
    fig = Figure(figsize=(11, 4), layout="constrained")
    ax_a, ax_b = fig.subplots(1, 2, sharey=True)
    for i, (label, rows) in enumerate(rows_by_label.items()):
        rows = sorted(rows, key=lambda r: r.n_bytes)
        sizes = [r.n_bytes for r in rows]
        style = {"color": _COLORS[i % len(_COLORS)], "marker": "o", "ms": 3, "label": label}
        ax_a.plot(sizes, [r.algbw_gbps for r in rows], **style)
        ax_b.plot(sizes, [r.busbw_gbps for r in rows], **style)
    _log_axes(ax_a, "size n (bytes)", "GB/s")
    _log_axes(ax_b, "size n (bytes)", "GB/s")
    ax_a.set_title("algbw = n / t")
    ax_b.set_title("busbw = algbw · factor(p)")
    ax_a.legend(fontsize=8)
    fig.suptitle(title or "algorithm bandwidth vs bus bandwidth")
    return fig


def what_if_scaling(
    collective: str,
    n_bytes: float,
    world_sizes: Sequence[int],
    network: Network,
    algorithms: Sequence[str] | None = None,
    title: str = "",
) -> Figure:
    """Predicted time of one collective against the number of ranks, per algorithm.

    Args:
        collective: as ``lk.costmodel.predict``.
        n_bytes: the size n.
        world_sizes: ranks to plot (e.g. 2 … 8192).
        network: the ``Network``.
        algorithms: which algorithms (default: all of ``collective``).
        title: the figure's title.

    Returns:
        A ``Figure`` with one log-log axis: time (s) against ranks.

    Raises:
        ValueError: as ``predict``, or no world sizes.
    """
    if not world_sizes:
        raise ValueError("scaling needs at least one world size")
    names = list(algorithms) if algorithms is not None else list(ALGORITHMS[collective])
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    for i, a in enumerate(names):
        times = [predict(collective, n_bytes, p, network, a) for p in world_sizes]
        ax.plot(
            world_sizes, times, "o-", ms=3, color=_COLORS[i % len(_COLORS)], label=LABELS.get(a, a)
        )
    _log_axes(ax, "ranks p", "predicted time (s)")
    ax.legend(fontsize=8)
    ax.set_title(title or f"{collective} of {n_bytes:.3g} bytes on {network.label()}")
    return fig


def algorithm_crossover(
    collective: str,
    world_size: int,
    network: Network,
    algorithm_a: str,
    algorithm_b: str,
    sizes: Sequence[float] | None = None,
    title: str = "",
) -> Figure:
    """Two algorithms' predicted time against size, with the crossover size n* marked.

    Args:
        collective: as ``lk.costmodel.predict``.
        world_size: number of ranks.
        network: the ``Network``.
        algorithm_a: the latency-bound algorithm (e.g. ``"recursive_doubling"``).
        algorithm_b: the bandwidth-bound one (e.g. ``"ring"``).
        sizes: the x range (default: 1 B to 1 GB).
        title: the figure's title.

    Returns:
        A ``Figure`` with one log-log axis; n* from ``lk.costmodel.crossover_bytes``.

    Raises:
        ValueError: as ``predict``.
    """
    lo, hi = (min(sizes), max(sizes)) if sizes else (1.0, float(1 << 30))
    grid = _grid(max(lo, 1.0), hi)
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    for i, a in enumerate((algorithm_a, algorithm_b)):
        times = [predict(collective, n, world_size, network, a) for n in grid]
        ax.plot(grid, times, "-", color=_COLORS[i], label=a)
    n_star = crossover_bytes(collective, world_size, network, algorithm_a, algorithm_b)
    if n_star is not None and grid[0] <= n_star <= grid[-1]:
        t_star = predict(collective, n_star, world_size, network, algorithm_a)
        ax.axvline(n_star, ls=":", color="gray")
        ax.plot([n_star], [t_star], "ks", label=f"n* = {n_star:,.0f} B")
    _log_axes(ax, "size n (bytes)", "predicted time (s)")
    ax.legend(fontsize=8)
    ax.set_title(title or f"{collective} on {world_size} ranks, {network.label()}")
    return fig
