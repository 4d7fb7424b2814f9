"""The planner's plans as bars: step time by part and memory per device by kind.

Introduced in notebooks/18_hybrid_parallel.ipynb.

The numbers are ``labkit.planner.plan``'s (pure arithmetic), so drawing costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from labkit.memory import GB

__all__ = ["plan_breakdown"]

_TIME = (
    ("compute", "compute", "#4c72b0"),
    ("bubble", "pipeline bubble", "#8c8c8c"),
    ("dp", "dp communication", "#dd8452"),
    ("tp", "tp communication", "#55a868"),
    ("pp", "pp communication", "#8172b3"),
)
_MEMORY = (
    ("params", "parameters", "#4c72b0"),
    ("grads", "gradients", "#dd8452"),
    ("optimizer", "optimizer states", "#55a868"),
    ("activations", "activations", "#c44e52"),
)


def _time_parts(p: Any) -> dict[str, float]:
    return {"compute": p.compute_s, "bubble": p.bubble_s, **p.comm}


def plan_breakdown(
    plans: Sequence[Any],
    memory_budget_bytes: float | None = None,
    top: int = 12,
    title: str = "",
) -> Figure:
    """Two panels for the first ``top`` plans: step time by part, memory per device by kind.

    Plans that break a divisibility rule (no numbers) are skipped; plans over the memory budget are
    hatched.

    Args:
        plans: ``labkit.planner.Plan`` s, best first (as ``plan`` returns them).
        memory_budget_bytes: draw the device memory as a line (e.g. ``devices.memory_bytes``).
        top: how many plans to draw.
        title: the figure's title.

    Returns:
        A ``matplotlib.figure.Figure`` with two axes (seconds per step; GB per device).

    Raises:
        ValueError: no plan with numbers to draw, or ``top`` < 1.
    """
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    shown = [p for p in plans if p.step_s == p.step_s][:top]  # NaN: no numbers
    if not shown:
        raise ValueError("plan_breakdown needs at least one plan with numbers")
    fig = Figure(figsize=(10, 0.45 * len(shown) + 2.4), layout="constrained")
    ax_t, ax_m = fig.subplots(1, 2, sharey=True)
    ys = list(range(len(shown)))[::-1]  # best plan on top
    for ax, parts, scale, get in (
        (ax_t, _TIME, 1.0, _time_parts),
        (ax_m, _MEMORY, 1 / GB, lambda p: p.breakdown),
    ):
        left = [0.0] * len(shown)
        for key, label, color in parts:
            widths = [get(p).get(key, 0.0) * scale for p in shown]
            hatch = ["//" if not p.feasible else "" for p in shown]
            bars = ax.barh(ys, widths, left=left, color=color, label=label, height=0.7)
            for bar, h in zip(bars, hatch, strict=True):
                bar.set_hatch(h)
            left = [a + w for a, w in zip(left, widths, strict=True)]
    if memory_budget_bytes is not None:
        ax_m.axvline(memory_budget_bytes / GB, color="k", ls="--", lw=1.2, label="device memory")
    ax_t.set_yticks(ys, [p.label + ("" if p.feasible else " ✗") for p in shown], fontsize=8)
    ax_t.set_xlabel("predicted seconds per step")
    ax_m.set_xlabel("predicted memory per device (GB)")
    for ax in (ax_t, ax_m):
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    fig.suptitle(title or "plans, best first (✗, hatched: does not fit)")
    return fig
