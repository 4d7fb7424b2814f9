"""Fault-tolerance figures: a run killed, resumed from its last checkpoint, and what was lost.

Introduced in notebooks/19_fault_tolerance.ipynb.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

__all__ = ["resume_timeline"]


def resume_timeline(
    reference_losses: Sequence[float],
    resumed_losses: Sequence[float],
    resumed_from: int,
    checkpoint_steps: Sequence[int],
    kill_at: int,
    title: str = "",
) -> Figure:
    """Loss per step of an uninterrupted run and of a run killed and resumed from a checkpoint.

    The steps between the resumed checkpoint and the kill are shaded: they were trained twice
    (the work a kill costs). Bit-identical resumption shows as the resumed markers sitting
    exactly on the uninterrupted line.

    Args:
        reference_losses: loss of steps 1, 2, ... of the uninterrupted run.
        resumed_losses: loss of steps ``resumed_from + 1``, ... of the resumed run.
        resumed_from: the step of the checkpoint the run resumed from.
        checkpoint_steps: the steps after which checkpoints were written.
        kill_at: the step after which the run was killed.
        title: figure title.

    Returns:
        A ``matplotlib.figure.Figure`` with one axes.

    Raises:
        ValueError: ``reference_losses`` is empty or ``resumed_from > kill_at``.
    """
    if not reference_losses:
        raise ValueError("resume_timeline needs the uninterrupted run's losses")
    if resumed_from > kill_at:
        raise ValueError(f"resumed_from ({resumed_from}) is after the kill ({kill_at})")
    fig = Figure(figsize=(7.5, 3.6), layout="constrained")
    ax = fig.subplots()
    steps = range(1, len(reference_losses) + 1)
    ax.plot(steps, list(reference_losses), color="C0", label="uninterrupted run")
    after = range(resumed_from + 1, resumed_from + 1 + len(resumed_losses))
    ax.plot(after, list(resumed_losses), "o", color="C1", mfc="none", label="resumed run")
    ax.axvspan(resumed_from, kill_at, color="C3", alpha=0.15, label="work lost to the kill")
    ax.axvline(kill_at, color="C3", lw=1.5, label=f"SIGKILL after step {kill_at}")
    for i, s in enumerate(checkpoint_steps):
        ax.axvline(s, color="grey", ls=":", label="checkpoint" if i == 0 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (rank 0)")
    ax.legend(fontsize="small")
    ax.set_title(title or f"killed after step {kill_at}, resumed from step {resumed_from}")
    return fig
