"""Activation recomputation's trade: bytes kept for backward against FLOPs spent, per mode.

Introduced in notebooks/14_activation_recomputation.ipynb.

Bars are the model's (``labkit.memory.block_activation_terms`` and ``block_flops``), stacked
term by term; black ticks are what was measured (saved-tensor hooks, ``FlopCounterMode``).
Imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping

from matplotlib.figure import Figure

__all__ = ["recompute_tradeoff"]

_PHASES = (("forward", "#4c72b0"), ("backward", "#dd8452"), ("recompute", "#c44e52"))
_PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
            "#8c8c8c", "#ccb974", "#64b5cd", "#1f77b4", "#ff7f0e", "#2ca02c")  # fmt: skip


def recompute_tradeoff(
    kept: Mapping[str, Mapping[str, float]],
    flops: Mapping[str, Mapping[str, float]],
    measured_bytes: Mapping[str, float] | None = None,
    measured_flops: Mapping[str, float] | None = None,
    title: str = "",
) -> Figure:
    """Two panels, one bar per recompute mode: kB kept for backward, and MFLOPs of a step.

    Args:
        kept: mode → {tensor name: bytes} (``block_activation_terms(..., recompute=mode)``),
            stacked in order; a name keeps its colour across modes.
        flops: mode → {"forward", "backward", "recompute": FLOPs} (``block_flops``).
        measured_bytes: mode → bytes measured, drawn as a black tick.
        measured_flops: mode → FLOPs counted, drawn as a black tick.
        title: the figure's title.

    Returns:
        matplotlib.figure.Figure with two axes (kB, MFLOP).

    Raises:
        ValueError: no modes, or ``kept`` and ``flops`` with different modes.
    """
    if not kept or list(kept) != list(flops):
        raise ValueError("recompute_tradeoff needs the same modes, at least one, in kept and flops")
    modes = list(kept)
    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    names = list(dict.fromkeys(n for terms in kept.values() for n in terms))
    colors = {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(names)}
    bottoms = [0.0] * len(modes)
    for name in names:
        kb = [kept[m].get(name, 0.0) / 1e3 for m in modes]
        left.bar(range(len(modes)), kb, bottom=bottoms, color=colors[name], label=name)
        bottoms = [b + k for b, k in zip(bottoms, kb, strict=True)]
    _ticks(left, modes, measured_bytes, 1e3)
    left.set_ylabel("kept for backward (kB)")
    left.legend(fontsize=7, ncol=2)
    tops = [0.0] * len(modes)
    for phase, color in _PHASES:
        mf = [flops[m].get(phase, 0.0) / 1e6 for m in modes]
        right.bar(range(len(modes)), mf, bottom=tops, color=color, label=phase)
        tops = [t + v for t, v in zip(tops, mf, strict=True)]
    _ticks(right, modes, measured_flops, 1e6)
    right.set_ylabel("products per step (MFLOP)")
    right.legend(fontsize=8)
    fig.suptitle(title or "activation recomputation: memory kept against compute spent")
    return fig


def _ticks(ax, modes: list[str], measured: Mapping[str, float] | None, unit: float) -> None:
    if measured:
        xs = [i for i, m in enumerate(modes) if m in measured]
        ys = [measured[modes[i]] / unit for i in xs]
        ax.scatter(xs, ys, marker="_", s=900, color="black", zorder=3, label="measured")
    ax.set_xticks(range(len(modes)), modes)
