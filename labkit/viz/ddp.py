"""Figures for DDP's knobs: step time against bucket size, and what a comm hook trades.

Introduced in notebooks/07_ddp_buckets_and_overlap.ipynb.

- ``bucket_size_sweep``: measured step time against ``bucket_cap_mb`` (log axis), one line
  per backend or network, with the model's prediction dashed where there is one — the
  trade-off of Li et al. 2020 ("PyTorch Distributed", §3.2.3 and Fig. 7): small buckets pay
  the per-collective latency many times, large ones start communicating late.
- ``comm_hook_tradeoff``: bytes sent per step and accuracy reached, one bar per comm hook.

Plain numbers in, a ``matplotlib.figure.Figure`` out; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

__all__ = ["bucket_size_sweep", "comm_hook_tradeoff"]


def bucket_size_sweep(
    caps_mb: Sequence[float],
    step_s: Mapping[str, Sequence[float]],
    predicted_s: Mapping[str, Sequence[float]] | None = None,
    n_buckets: Sequence[int] | None = None,
    title: str | None = None,
) -> Figure:
    """Step time (ms) against the bucket cap (MiB, log scale), one line per label.

    Args:
        caps_mb: the ``bucket_cap_mb`` values swept (> 0).
        step_s: label (e.g. ``"gloo"``, ``"simulated 1 GbE"``) → step time per cap, seconds.
        predicted_s: label → the model's step time per cap (dashed, same colour as the
            measured line of that label when there is one).
        n_buckets: buckets at each cap, written on a second x axis at the top.
        title: the figure title.

    Returns:
        matplotlib.figure.Figure: one axes.

    Raises:
        ValueError: no caps, a cap ≤ 0, or a series whose length is not ``len(caps_mb)``.
    """
    caps = [float(c) for c in caps_mb]
    if not caps or any(c <= 0 for c in caps):
        raise ValueError(f"need caps > 0, got {caps_mb!r}")
    predicted_s = predicted_s or {}
    for name, series in [*step_s.items(), *predicted_s.items()]:
        if len(series) != len(caps):
            raise ValueError(f"{name!r}: {len(series)} values for {len(caps)} caps")
    if n_buckets is not None and len(n_buckets) != len(caps):
        raise ValueError(f"{len(n_buckets)} bucket counts for {len(caps)} caps")
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    colors: dict[str, str] = {}
    for name, series in step_s.items():
        (line,) = ax.plot(caps, [1e3 * t for t in series], "o-", label=f"{name} (measured)")
        colors[name] = line.get_color()
    for name, series in predicted_s.items():
        ax.plot(
            caps,
            [1e3 * t for t in series],
            "--",
            color=colors.get(name),
            label=f"{name} (model)",
        )
    ax.set_xscale("log")
    ax.set_xticks(caps, [f"{c:g}" for c in caps])
    ax.minorticks_off()
    ax.set_xlabel("bucket_cap_mb (MiB)")
    ax.set_ylabel("step time (ms)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    if n_buckets is not None:
        top = ax.secondary_xaxis("top")
        top.set_xticks(caps, [str(n) for n in n_buckets])
        top.minorticks_off()
        top.set_xlabel("buckets")
    ax.set_title(title or "DDP step time against bucket size")
    return fig


def comm_hook_tradeoff(
    names: Sequence[str],
    sent_bytes: Sequence[float],
    accuracy: Sequence[float],
    title: str | None = None,
) -> Figure:
    """Two bar charts side by side: bytes all-reduced per step, and accuracy, per comm hook.

    Args:
        names: the hooks, e.g. ``["allreduce (default)", "fp16", "PowerSGD r=2"]``; the
            first is the baseline the others are compared with.
        sent_bytes: bytes each rank all-reduced per step with that hook (> 0 for the first).
        accuracy: test accuracy (0-1) reached with it after the same number of steps.
        title: the figure title.

    Returns:
        matplotlib.figure.Figure: left, bytes per step with the fraction of the baseline on
        each bar; right, accuracy, written on each bar.

    Raises:
        ValueError: lengths differ, nothing to draw, or the baseline sent no bytes.
    """
    if not names or not (len(names) == len(sent_bytes) == len(accuracy)):
        raise ValueError("names, sent_bytes and accuracy need one entry per hook")
    if not sent_bytes[0] > 0:
        raise ValueError("the first hook (the baseline) must send some bytes")
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    x = list(range(len(names)))
    kb = [n / 1e3 for n in sent_bytes]
    bars = left.bar(x, kb, color="#ff7f0e")
    for bar, n in zip(bars, sent_bytes, strict=True):
        left.annotate(
            f"{n / sent_bytes[0]:.0%}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    left.set_ylabel("kB all-reduced per step, per rank")
    left.set_title("communication")
    acc_bars = right.bar(x, [100 * a for a in accuracy], color="#1f77b4")
    for bar, a in zip(acc_bars, accuracy, strict=True):
        right.annotate(
            f"{a:.1%}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    right.set_ylabel("test accuracy (%)")
    right.set_ylim(0, 100)
    right.set_title("accuracy after the same steps")
    for ax in (left, right):
        ax.set_xticks(x, list(names), rotation=15, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title or "What a comm hook trades: bytes against accuracy")
    return fig
