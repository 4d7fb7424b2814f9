"""Tokens per expert in a mixture of experts: what each group sent, what capacity kept.

Introduced in notebooks/17_expert_parallel.ipynb.

Reads plain counts (lists or tensors' ``.tolist()``); imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch

__all__ = ["expert_load"]

_RANK_COLORS = ("#4c72b0", "#55a868", "#8172b2", "#ccb974", "#64b5cd", "#8c8c8c", "#937860")
_DROPPED = "#c44e52"


def expert_load(
    demand: Sequence[Sequence[int]],
    kept: Sequence[Sequence[int]],
    capacity: int,
    experts_per_rank: int | None = None,
    title: str = "",
) -> Figure:
    """Bars of the assignments each expert got from each group: kept below, dropped above.

    One panel per group of tokens (under expert parallelism: one rank's tokens). A dashed
    line marks the capacity ``C`` (``labkit.costmodel.expert_capacity``); what a group routed
    to an expert beyond it is dropped (Switch Transformer, Fedus et al. 2021, §2.2).

    Args:
        demand: per group, per expert: the assignments routed there (top-k, before capacity).
        kept: per group, per expert: the assignments kept (each ≤ ``capacity`` and ≤ demand).
        capacity: ``C``, assignments per expert and group.
        experts_per_rank: colour the experts by the rank that holds them (``E/ep``); None:
            one colour.
        title: the figure's title.

    Returns:
        matplotlib.figure.Figure: one panel per group, experts on the x axis.

    Raises:
        ValueError: no groups, groups of different sizes, ``demand`` and ``kept`` of different
            shapes, or a kept count above its demand or the capacity.
    """
    if not demand or len(demand) != len(kept):
        raise ValueError("expert_load needs one row of demand and of kept per group")
    n_experts = len(demand[0])
    for g, (d, k) in enumerate(zip(demand, kept, strict=True)):
        if len(d) != n_experts or len(k) != n_experts:
            raise ValueError(f"group {g}: every group needs one count per expert ({n_experts})")
        if any(kk > dd or kk > capacity for dd, kk in zip(d, k, strict=True)):
            raise ValueError(f"group {g}: a kept count exceeds its demand or capacity {capacity}")
    fig = Figure(figsize=(2 + 2.2 * len(demand), 3.4), layout="constrained")
    axes = fig.subplots(1, len(demand), sharey=True, squeeze=False)[0]
    per_rank = experts_per_rank or n_experts
    colors = [_RANK_COLORS[(e // per_rank) % len(_RANK_COLORS)] for e in range(n_experts)]
    for g, (ax, d, k) in enumerate(zip(axes, demand, kept, strict=True)):
        dropped = [dd - kk for dd, kk in zip(d, k, strict=True)]
        ax.bar(range(n_experts), k, color=colors)
        over = [e for e in range(n_experts) if dropped[e]]  # no empty outline on the rest
        ax.bar(over, [dropped[e] for e in over], bottom=[k[e] for e in over], color="white",
               edgecolor=_DROPPED, hatch="///", label="dropped")  # fmt: skip
        ax.axhline(capacity, color="black", linestyle="--", linewidth=0.8, label="capacity C")
        ax.set_xticks(range(n_experts))
        ax.set_xlabel("expert")
        ax.set_title(f"group {g}: {sum(k)} kept, {sum(dropped)} dropped", fontsize=9)
    axes[0].set_ylabel("assignments")
    handles, labels = axes[0].get_legend_handles_labels()
    if experts_per_rank:  # one swatch per rank: the experts it holds
        for r in range(-(-n_experts // per_rank)):
            handles.append(Patch(color=_RANK_COLORS[r % len(_RANK_COLORS)]))
            labels.append(f"kept, experts of rank {r}")
    fig.legend(handles, labels, loc="outside lower center", ncol=6, frameon=False)
    if title:
        fig.suptitle(title)
    return fig
