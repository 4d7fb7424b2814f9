"""Memory per stage of a model split across ranks: measured bars, the model's totals as marks.

Introduced in notebooks/10_model_parallel.ipynb.

Reads ``labkit.parallel.model_split.StageMemory`` rows by attribute; imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

__all__ = ["stage_memory"]

_PARTS = (
    ("params_bytes", "parameters", "#4c72b0"),
    ("grads_bytes", "gradients", "#dd8452"),
    ("optimizer_bytes", "optimizer states", "#55a868"),
    ("activation_bytes", "activations", "#c44e52"),
)


def stage_memory(
    measured: Mapping[str, Sequence[Any]],
    modelled: Mapping[str, Sequence[Any]] | None = None,
    title: str = "",
) -> Figure:
    """Stacked bars of each stage's bytes (parameters, gradients, optimizer, activations).

    Args:
        measured: split name → one ``StageMemory`` per stage (counted tensors); one panel
            per split, side by side on a shared axis.
        modelled: split name → the model's ``StageMemory`` per stage, drawn as a black tick
            at each stage's modelled total.
        title: the figure's title.

    Returns:
        matplotlib.figure.Figure: kB per stage; the dashed line is the panel's largest stage.

    Raises:
        ValueError: no splits, or a split with no stages.
    """
    if not measured or any(len(rows) == 0 for rows in measured.values()):
        raise ValueError("stage_memory needs at least one split with at least one stage")
    fig = Figure(figsize=(4 + 2.5 * len(measured), 3.8), layout="constrained")
    axes = fig.subplots(1, len(measured), sharey=True, squeeze=False)[0]
    for ax, (name, rows) in zip(axes, measured.items(), strict=True):
        bottoms = [0.0] * len(rows)
        for attr, label, color in _PARTS:
            kb = [getattr(r, attr) / 1e3 for r in rows]
            ax.bar(range(len(rows)), kb, bottom=bottoms, color=color, label=label)
            bottoms = [b + k for b, k in zip(bottoms, kb, strict=True)]
        if modelled and name in modelled:
            totals = [m.total_bytes / 1e3 for m in modelled[name]]
            ax.scatter(range(len(totals)), totals, marker="_", s=600, color="black", zorder=3)
        ax.axhline(max(bottoms), color="gray", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(rows)), [f"stage {s}" for s in range(len(rows))])
        ax.set_title(f"{name}: largest {max(bottoms):,.1f} kB")
    axes[0].set_ylabel("kB per stage (measured; — model)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, frameon=False)
    if title:
        fig.suptitle(title)
    return fig
