"""One step of a recorded ring all-reduce: every rank's buffer, chunk by chunk.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

Draws a frame of a ``RingTrace`` (``labkit.collectives.ring_trace``): one row per rank, its
buffer as boxes grouped by chunk, each box shaded by how many ranks' inputs it already sums
(dark green: all p, the final value). The chunk a rank received in the step has a thick red
edge, the chunk it sent a dashed one, and the right column says who sent what to whom.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from labkit.viz.collectives import _fmt

__all__ = ["ring_allreduce_step"]

_ROW = 1.5  # row pitch in box units
_GAP = 0.5  # space between chunks
_NOTE = 9.0  # box units for the right-hand notes


def _shade(k: int, p: int) -> tuple[Any, Any]:
    from matplotlib import colormaps

    if k >= p:
        return colormaps["Greens"](0.55), "#1b5e20"
    return colormaps["Blues"](0.12 + 0.5 * (k - 1) / max(p - 1, 1)), "0.35"


def ring_allreduce_step(trace: Any, frame: int) -> Figure:
    """Every rank's buffer after ``frame`` steps of a recorded ring all-reduce.

    Ring reduce-scatter then ring all-gather (Thakur, Rabenseifner and Gropp 2005, §4):
    ``frame`` 0 shows the inputs, frame k ≥ 1 the buffers after step k of 2(p−1), with the
    chunk each rank sent and received in that step.

    Args:
        trace: a ``RingTrace`` from ``lk.collectives.ring_trace.trace_ring_allreduce``.
        frame: 0 … ``len(trace.steps)``.

    Returns:
        A ``matplotlib.figure.Figure`` (not attached to pyplot).

    Raises:
        ValueError: ``frame`` out of range.
    """
    n_steps = len(trace.steps)
    if isinstance(frame, bool) or not isinstance(frame, int) or not 0 <= frame <= n_steps:
        raise ValueError(f"frame must be an int in 0..{n_steps}, got {frame!r}")
    p = trace.world_size
    step = trace.steps[frame - 1] if frame else None
    state = step.after if step else trace.inputs
    who = step.contributors if step else [[(r,)] * len(trace.inputs[r]) for r in range(p)]
    sent = {t.src: t for t in step.transfers} if step else {}
    got = {t.dst: t for t in step.transfers} if step else {}

    x_of: list[float] = []
    for c, (a, b) in enumerate(trace.chunks):
        x_of += [i + c * _GAP for i in range(a, b)]
    width = (x_of[-1] + 1) if x_of else 1.0
    unit = min(0.55, 11.0 / (width + _NOTE + 2))
    fig = Figure(figsize=((width + _NOTE + 2) * unit, (p * _ROW + 1.6) * unit + 0.5))
    ax = fig.add_axes((0.0, 0.0, 1.0, 0.88))
    ax.set_xlim(-2.0, width + _NOTE)
    ax.set_ylim(-(p - 0.5) * _ROW - 0.2, 0.9 * _ROW)
    ax.axis("off")
    fontsize = max(5.0, min(9.0, unit * 72 * 0.3))
    for c, (a, b) in enumerate(trace.chunks):
        if b > a:
            mid = (x_of[a] + x_of[b - 1] + 1) / 2
            ax.text(mid, 0.6 * _ROW, f"chunk {c}", ha="center", va="center", fontsize=fontsize)
    for r in range(p):
        y = -r * _ROW
        ax.text(-0.3, y, f"rank {r}", ha="right", va="center", fontsize=fontsize, weight="bold")
        recv_c = got[r].chunk if r in got else None
        send_c = sent[r].chunk if r in sent else None
        for i, v in enumerate(state[r]):
            c = next(k for k, (a, b) in enumerate(trace.chunks) if a <= i < b)
            face, edge = _shade(len(who[r][i]), p)
            style, lw = "-", 0.8
            if c == recv_c:
                edge, lw = "#c62828", 2.4
            elif c == send_c:
                style, lw = "--", 1.8
            ax.add_patch(
                Rectangle(
                    (x_of[i] + 0.05, y - 0.45),
                    0.9,
                    0.9,
                    facecolor=face,
                    edgecolor=edge,
                    linewidth=lw,
                    linestyle=style,
                )
            )
            ax.text(x_of[i] + 0.5, y, _fmt(v), ha="center", va="center", fontsize=fontsize)
        if r in sent:
            t, op = sent[r], "+=" if step.phase == "reduce-scatter" else "copy"
            note = f"sent chunk {t.chunk} → rank {t.dst}; got chunk {got[r].chunk} ({op})"
            ax.text(width + 0.4, y, note, ha="left", va="center", fontsize=fontsize)
    if step is None:
        head = "inputs (before step 1)"
    else:
        head = f"{step.phase} step {step.step + 1} of {p - 1} (step {frame} of {n_steps})"
    fig.suptitle(f"ring all-reduce on {p} ranks: {head}", fontsize=10)
    fig.text(
        0.5,
        0.9,
        "shade: how many ranks' inputs a value sums (green: all); red edge: received this step;"
        " dashed: sent",
        ha="center",
        fontsize=7,
        color="0.3",
    )
    return fig
