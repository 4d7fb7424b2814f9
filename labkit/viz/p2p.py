"""Point-to-point latency and bandwidth against message size, with the α-β model on top.

Introduced in notebooks/01_point_to_point.ipynb.

The two panels are the usual pair of ping-pong plots (as OSU's ``osu_latency`` and
``osu_bw`` report them): time of one message and bandwidth, both against size on log axes.
With a fit, the model's curves of Hockney's ``t(n) = α + nβ`` are drawn over the points: the
latency floor α, the asymptotic bandwidth 1/β, and n½ = α/β where the two meet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

__all__ = ["p2p_latency_bandwidth"]

_POINTS = "#1f77b4"
_MODEL = "#d62728"


def _model_sizes(lo: float, hi: float, n: int = 200) -> list[float]:
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def p2p_latency_bandwidth(results: Sequence[Any], fit: Any = None, title: str = "") -> Figure:
    """Plot one-way time and bandwidth against message size (log axes), with the fit's curves.

    Args:
        results: rows with ``n_bytes``, ``time_s`` (median) and ``algbw_gbps``, and
            optionally ``time_min_s`` (drawn as hollow markers when it differs), e.g. the
            ``BenchResult`` list from ``lk.bench.p2p_pingpong``.
        fit: optional ``lk.bench.AlphaBeta`` (anything with ``alpha``, ``beta`` and
            ``time_s(n)``); adds the model's latency and bandwidth curves, 1/β and n½.
        title: figure title (default: names the operation, backend and device).

    Returns:
        A ``matplotlib.figure.Figure`` with two axes: time (µs) and bandwidth (GB/s).

    Raises:
        ValueError: ``results`` is empty.
    """
    rows = sorted(results, key=lambda r: r.n_bytes)
    if not rows:
        raise ValueError("p2p_latency_bandwidth needs at least one result row")
    sizes = [r.n_bytes for r in rows]
    fig = Figure(figsize=(11, 4), layout="constrained")
    ax_t, ax_bw = fig.subplots(1, 2)
    ax_t.plot(sizes, [r.time_s * 1e6 for r in rows], "o", color=_POINTS, label="median")
    ax_bw.plot(sizes, [r.algbw_gbps for r in rows], "o", color=_POINTS, label="median")
    mins = [getattr(r, "time_min_s", r.time_s) for r in rows]
    if any(m != r.time_s for m, r in zip(mins, rows, strict=True)):  # samples were kept
        style = {"ls": "none", "marker": "v", "mfc": "none", "color": _POINTS, "label": "min"}
        ax_t.plot(sizes, [m * 1e6 for m in mins], **style)
        ax_bw.plot(sizes, [n / m / 1e9 for n, m in zip(sizes, mins, strict=True)], **style)
    if fit is not None:
        grid = _model_sizes(sizes[0], sizes[-1])
        ax_t.plot(
            grid,
            [fit.time_s(n) * 1e6 for n in grid],
            "-",
            color=_MODEL,
            label=f"α + nβ  (α = {fit.alpha * 1e6:.1f} µs)",
        )
        ax_bw.plot(
            grid, [n / fit.time_s(n) / 1e9 for n in grid], "-", color=_MODEL, label="n / (α + nβ)"
        )
        if fit.beta > 0:
            peak = 1 / fit.beta / 1e9
            ax_bw.axhline(peak, ls="--", color=_MODEL, lw=1, label=f"1/β = {peak:.2f} GB/s")
            n_half = fit.alpha / fit.beta
            if sizes[0] <= n_half <= sizes[-1]:
                ax_bw.axvline(
                    n_half, ls=":", color="gray", lw=1, label=f"n½ = α/β = {n_half / 1e3:.0f} kB"
                )
    for ax in (ax_t, ax_bw):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="major", alpha=0.3)
    ax_t.legend(loc="upper left", fontsize=8)
    ax_bw.legend(loc="lower right", fontsize=8)
    ax_t.set_ylabel("one-way time (µs)")
    ax_bw.set_ylabel("bandwidth (GB/s)")
    ax_t.set_title("latency")
    ax_bw.set_title("bandwidth")
    r0 = rows[0]
    default = f"{r0.op} ping-pong, {getattr(r0, 'backend', '?')}, {getattr(r0, 'device', '')}"
    fig.suptitle(title or default.rstrip(", "))
    return fig
