"""Figures of all-reduce algorithms, drawn from what the ranks really sent and measured.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

- ``message_diagram``: the space-time diagram of one run (ranks as horizontal lines, one
  column per step, an arrow per message), the way Thakur, Rabenseifner and Gropp 2005 draw
  their algorithms, but from the messages ``lk.collectives.count_messages`` recorded.
- ``traffic_per_rank``: messages and bytes each rank sent, per algorithm, with the formulas'
  values marked on the bars.
- ``allreduce_times``: measured time against message size for each algorithm, and each
  one's ratio to ``dist.all_reduce``.

This module reads messages by their attributes (``direction``, ``peer``, ``numel``,
``phase``, ``step``) and never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

__all__ = ["allreduce_times", "message_diagram", "traffic_per_rank"]

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def _color(i: int) -> str:
    return _COLORS[i % len(_COLORS)]


def _messages(entry: Any) -> list[Any]:
    return list(getattr(entry, "messages", entry) or [])


def _step_order(per_rank: list[list[Any]]) -> list[tuple[str, int]]:
    """(phase, step) keys in time order: each rank's log is a chain; merge the chains."""
    keys: list[tuple[str, int]] = []
    after: dict[tuple[str, int], set[tuple[str, int]]] = {}
    for msgs in per_rank:
        chain = []
        for m in msgs:
            key = (m.phase, m.step)
            if key not in keys:
                keys.append(key)
            if not chain or chain[-1] != key:
                chain.append(key)
        for a, b in zip(chain, chain[1:], strict=False):
            after.setdefault(b, set()).add(a)
    ordered: list[tuple[str, int]] = []
    while len(ordered) < len(keys):  # Kahn's algorithm, ties broken by first appearance
        ready = [k for k in keys if k not in ordered and after.get(k, set()) <= set(ordered)]
        ordered.append(ready[0] if ready else next(k for k in keys if k not in ordered))
    return ordered


def message_diagram(messages: Sequence[Any], title: str = "", *, show_sizes: bool = True) -> Figure:
    """Draw who sent what to whom, step by step, in one run of a collective algorithm.

    Each rank is a horizontal line; each column is one step of the algorithm (steps are
    ordered from the order in which every rank recorded them); each message is an arrow
    from its sender's line to its receiver's, in the sender's colour, labelled with its
    number of elements. Phases (e.g. reduce-scatter, all-gather) are named above.

    Args:
        messages: one entry per rank: a ``CommStats`` or a list of ``Message`` (anything
            with ``direction``, ``peer``, ``numel``, ``phase`` and ``step``); peers are ranks
            of the same list.
        title: the figure's title (default: the number of ranks, messages and steps).
        show_sizes: label each arrow with its number of elements.

    Returns:
        A ``matplotlib.figure.Figure`` (not attached to pyplot).

    Raises:
        ValueError: no ranks, or a message names a peer outside ``range(len(messages))``.
    """
    per_rank = [_messages(m) for m in messages]
    p = len(per_rank)
    if p == 0:
        raise ValueError("message_diagram needs one entry per rank; got none")
    order = _step_order(per_rank)
    column = {key: i for i, key in enumerate(order)}
    sends = [(r, m) for r, msgs in enumerate(per_rank) for m in msgs if m.direction == "send"]
    for r, m in sends:
        if not 0 <= m.peer < p:
            raise ValueError(f"rank {r} sent to rank {m.peer}, outside range({p})")
    k = max(len(order), 1)
    fig = Figure(figsize=(min(2.0 + 1.1 * k, 15.0), 1.0 + 0.55 * p), layout="constrained")
    ax = fig.add_subplot()
    for r in range(p):
        ax.plot([0, k], [-r, -r], color="0.75", lw=1, zorder=1)
    for r, m in sends:
        x = column[(m.phase, m.step)]
        ax.annotate(
            "",
            xy=(x + 0.85, -m.peer),
            xytext=(x + 0.15, -r),
            arrowprops={"arrowstyle": "-|>", "color": _color(r), "lw": 1.4, "shrinkB": 2},
            zorder=3,
        )
        if show_sizes:  # on the sender's line, on the side away from the arrow
            up = m.peer < r
            ax.text(
                x + 0.17,
                -r + (-0.07 if up else 0.07),
                str(m.numel),
                ha="left",
                va="top" if up else "bottom",
                fontsize=7,
                color=_color(r),
                zorder=4,
            )
    start = 0
    for i in range(1, len(order) + 1):  # one bracket per run of steps in the same phase
        if i == len(order) or order[i][0] != order[start][0]:
            ax.plot([start + 0.05, i - 0.05], [0.55, 0.55], color="0.3", lw=1)
            ax.text((start + i) / 2, 0.65, order[start][0], ha="center", va="bottom", fontsize=9)
            start = i
    ax.set_xlim(0, k)
    ax.set_ylim(-(p - 1) - 0.5, 1.2)
    ax.set_yticks([-r for r in range(p)], [f"rank {r}" for r in range(p)])
    ax.set_xticks([i + 0.5 for i in range(len(order))], [str(s) for _, s in order], fontsize=8)
    ax.set_xlabel("step within the phase")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    fig.suptitle(title or f"{p} ranks: {len(sends)} messages in {len(order)} steps")
    return fig


def traffic_per_rank(
    counted: Mapping[str, Sequence[Mapping[str, int]]],
    expected: Mapping[str, Sequence[Mapping[str, int]]] | None = None,
    title: str = "",
) -> Figure:
    """Bar charts of the messages and bytes each rank sent, one bar group per rank.

    Args:
        counted: algorithm → one dict per rank with ``messages_sent`` and ``bytes_sent``
            (``CommStats.summary()``).
        expected: the same from the formulas (``expected_messages`` / ``expected_bytes``),
            drawn as a black tick on each bar; optional.
        title: the figure's title.

    Returns:
        A ``matplotlib.figure.Figure`` with two axes: messages sent, bytes sent.

    Raises:
        ValueError: no algorithms, or algorithms with different numbers of ranks.
    """
    names = list(counted)
    if not names:
        raise ValueError("traffic_per_rank needs at least one algorithm")
    p = len(counted[names[0]])
    if any(len(counted[n]) != p for n in names):
        raise ValueError("every algorithm needs one entry per rank, for the same ranks")
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    axes = fig.subplots(1, 2)
    width = 0.8 / len(names)
    for ax, key, label in zip(
        axes, ("messages_sent", "bytes_sent"), ("messages sent", "bytes sent"), strict=True
    ):
        for i, name in enumerate(names):
            xs = [r - 0.4 + width * (i + 0.5) for r in range(p)]
            ax.bar(xs, [row[key] for row in counted[name]], width, color=_color(i), label=name)
            if expected is not None and name in expected:
                ax.scatter(
                    xs,
                    [row[key] for row in expected[name]],
                    marker="_",
                    s=180,
                    color="black",
                    zorder=3,
                    label="formula" if i == 0 else None,
                )
        ax.set_xticks(range(p), [f"rank {r}" for r in range(p)])
        ax.set_ylabel(label)
        ax.set_title(f"{label} per rank")
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8)
    fig.suptitle(title or f"one all-reduce on {p} ranks")
    return fig


def allreduce_times(
    sizes_bytes: Sequence[int],
    times_s: Mapping[str, Sequence[float]],
    reference: str = "dist.all_reduce",
    title: str = "",
) -> Figure:
    """Measured all-reduce time against message size, and each algorithm's ratio to a reference.

    Args:
        sizes_bytes: the message sizes in bytes.
        times_s: name → seconds per size (``lk.collectives.time_allreduce``), including
            ``reference``.
        reference: the entry the ratios divide by, drawn dashed in black.
        title: the figure's title.

    Returns:
        A ``matplotlib.figure.Figure`` with two axes: time (ms) and time / reference.

    Raises:
        ValueError: ``reference`` missing from ``times_s``, or lengths that differ from
            ``sizes_bytes``.
    """
    if reference not in times_s:
        raise ValueError(f"reference {reference!r} is not among {list(times_s)}")
    if any(len(v) != len(sizes_bytes) for v in times_s.values()):
        raise ValueError("every entry of times_s needs one time per size in sizes_bytes")
    fig = Figure(figsize=(11, 4), layout="constrained")
    ax_t, ax_r = fig.subplots(1, 2)
    ref = times_s[reference]
    others = [n for n in times_s if n != reference]
    for i, name in enumerate(others):
        ax_t.plot(sizes_bytes, [t * 1e3 for t in times_s[name]], "o-", color=_color(i), label=name)
        ratio = [t / r if r > 0 else float("nan") for t, r in zip(times_s[name], ref, strict=True)]
        ax_r.plot(sizes_bytes, ratio, "o-", color=_color(i), label=name)
    ax_t.plot(sizes_bytes, [t * 1e3 for t in ref], "k--", label=reference)
    ax_r.axhline(1.0, color="black", ls="--", lw=1, label=reference)
    for ax in (ax_t, ax_r):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_ylabel("time of one all-reduce (ms)")
    ax_r.set_ylabel(f"time / {reference}")
    ax_t.set_title("time")
    ax_r.set_title(f"ratio to {reference}")
    fig.suptitle(title or "all-reduce algorithms on this machine")
    return fig
