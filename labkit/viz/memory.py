"""Per-device memory of training under ZeRO: parameters, gradients, optimizer states per stage.

Introduced in notebooks/13_zero_and_fsdp.ipynb.

Bars come from ``labkit.memory`` (pure arithmetic: ZeRO, Rajbhandari et al. 2020, §5 and
Figure 1), so a figure of 1T parameters costs nothing to draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from labkit.memory import GB, STAGE_NAMES

__all__ = ["zero_memory_breakdown"]

_PARTS = (
    ("params_bytes", "parameters", "#4c72b0"),
    ("grads_bytes", "gradients", "#dd8452"),
    ("optimizer_bytes", "optimizer states", "#55a868"),
)


def _gb_text(gb: float) -> str:
    return f"{gb:,.3g} GB" if gb < 1000 else f"{gb:,.0f} GB"


def zero_memory_breakdown(
    breakdowns: Sequence[Any],
    highlight: int | None = None,
    device_gb: float | None = None,
    title: str = "",
) -> Figure:
    """Stacked bars of per-device parameters, gradients and optimizer states, one per stage.

    ZeRO (Rajbhandari et al. 2020, Figure 1): baseline DP holds (2 + 2 + K)Ψ per device,
    P_os, P_os+g and P_os+g+p divide the optimizer states, then the gradients, then the
    parameters by N_d.

    Args:
        breakdowns: ``labkit.memory.MemoryBreakdown`` s, e.g. one per stage for one model and
            DP degree.
        highlight: the stage whose bar is outlined (e.g. the one a widget selected).
        device_gb: draw a line at this device memory (e.g. 32 for a V100-32GB).
        title: the figure's title (default: names Ψ and N_d of the first breakdown).

    Returns:
        A ``matplotlib.figure.Figure`` with one axis, GB (10⁹ bytes) per device.

    Raises:
        ValueError: no breakdowns.
    """
    if not breakdowns:
        raise ValueError("zero_memory_breakdown needs at least one MemoryBreakdown")
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    xs = range(len(breakdowns))
    bottoms = [0.0] * len(breakdowns)
    for attr, label, color in _PARTS:
        heights = [getattr(b, attr) / GB for b in breakdowns]
        ax.bar(xs, heights, bottom=bottoms, color=color, label=label, width=0.6)
        bottoms = [lo + h for lo, h in zip(bottoms, heights, strict=True)]
    for x, b in zip(xs, breakdowns, strict=True):
        ax.text(x, b.total_bytes / GB, _gb_text(b.total_bytes / GB), ha="center", va="bottom")
        if b.stage == highlight:
            ax.bar([x], [b.total_bytes / GB], width=0.66, fill=False, edgecolor="k", lw=2.2)
    if device_gb is not None:
        ax.axhline(device_gb, color="#c44e52", ls="--", lw=1.2, label=f"device: {device_gb:g} GB")
    ax.set_xticks(list(xs), [f"stage {b.stage}\n{STAGE_NAMES[b.stage]}" for b in breakdowns])
    ax.set_ylabel("memory per device (GB)")
    ax.set_ylim(0, max(bottoms + [device_gb or 0]) * 1.15)
    ax.legend(fontsize=8)
    first = breakdowns[0]
    ax.set_title(
        title or f"model states per device: Ψ = {first.n_params / 1e9:g}B, N_d = {first.dp_degree}"
    )
    return fig
