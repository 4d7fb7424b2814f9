"""Training-loop figures: learning-rate schedules and loss curves compared run by run.

Introduced in notebooks/09_accumulation_and_precision.ipynb (the linear scaling rule with
warmup, Goyal et al. 2017 §2.1–2.2, and bf16 vs fp32 training).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

__all__ = ["loss_curves", "lr_schedule"]


def lr_schedule(
    curves: Mapping[str, Sequence[float]],
    warmup_steps: int | None = None,
    steps_per_epoch: int | None = None,
    title: str = "",
) -> Figure:
    """Plot learning rate against optimizer step, one line per schedule.

    Args:
        curves: label → learning rate at steps 0, 1, ... (e.g. read from
            ``optimizer.param_groups[0]["lr"]`` before each ``scheduler.step()``).
        warmup_steps: draw a dotted line where the warmup ends.
        steps_per_epoch: add a top axis in epochs.
        title: figure title.

    Returns:
        A ``matplotlib.figure.Figure`` with one axes.

    Raises:
        ValueError: ``curves`` is empty.
    """
    if not curves:
        raise ValueError("lr_schedule needs at least one curve")
    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.subplots()
    for label, lrs in curves.items():
        ax.step(range(len(lrs)), list(lrs), where="post", label=label)
    if warmup_steps:
        ax.axvline(warmup_steps, ls=":", color="grey", label=f"end of warmup (step {warmup_steps})")
    if steps_per_epoch:
        top = ax.secondary_xaxis(
            "top", functions=(lambda s: s / steps_per_epoch, lambda e: e * steps_per_epoch)
        )
        top.set_xlabel("epoch")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    ax.set_title(title or "learning rate per step")
    return fig


def _smooth(values: Sequence[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def loss_curves(
    curves: Mapping[str, Sequence[float]],
    window: int = 10,
    title: str = "",
    ylabel: str = "training loss",
    reference: str | None = None,
) -> Figure:
    """Plot per-step losses of several runs (moving average over ``window`` steps), log y axis.

    Args:
        curves: label → loss at each step.
        window: moving-average width in steps (1: raw values).
        title: figure title.
        ylabel: y-axis label.
        reference: a label of ``curves``; adds a second panel with each other run's smoothed
            loss minus this one's (runs that overlap on a log axis still differ there).

    Returns:
        A ``matplotlib.figure.Figure`` with one axes, or two with ``reference``.

    Raises:
        ValueError: ``curves`` is empty, ``window`` < 1, or ``reference`` is not a label.
    """
    if not curves or window < 1:
        raise ValueError("loss_curves needs at least one curve and window >= 1")
    if reference is not None and reference not in curves:
        raise ValueError(f"reference {reference!r} is not one of {list(curves)}")
    smooth = {label: _smooth(list(losses), window) for label, losses in curves.items()}
    fig = Figure(figsize=(11 if reference else 7, 3.6), layout="constrained")
    axes = fig.subplots(1, 2 if reference else 1, squeeze=False)[0]
    ax = axes[0]
    for label, values in smooth.items():
        ax.plot(values, label=label, lw=1.2)
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel + (f" (mean of {window} steps)" if window > 1 else ""))
    ax.legend(fontsize="small")
    if reference is not None:
        ref = smooth[reference]
        for i, (label, values) in enumerate(smooth.items()):
            if label != reference:
                diff = [a - b for a, b in zip(values, ref, strict=False)]
                axes[1].plot(diff, color=f"C{i}", lw=1.0, label=label)
        axes[1].axhline(0.0, color="grey", lw=0.8)
        axes[1].set_xlabel("optimizer step")
        axes[1].set_ylabel(f"difference from {reference}")
        axes[1].legend(fontsize="small")
    fig.suptitle(title or "loss per step")
    return fig
