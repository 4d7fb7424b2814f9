"""Idle time of naive model parallelism: measured from a trace timeline, and in theory.

Introduced in notebooks/10_model_parallel.ipynb. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["idle_fraction_theory", "idle_fractions"]


def idle_fractions(timeline: Any) -> list[float]:
    """Per rank, the share of the step it did not compute: 1 − forward and backward time / step.

    Reads the spans ``ModelSplit`` records (those with an ``"op"`` argument) from a
    ``lk.trace.Timeline``; the step runs from the first such span's start to the last one's
    end on any rank. Waiting in a receive counts as idle. Their mean is
    ``labkit.parallel.pipeline.measured_bubble_fraction`` of the same timeline.

    Args:
        timeline: a ``lk.trace.Timeline``.

    Returns:
        list[float]: one fraction per rank, in [0, 1].

    Raises:
        ValueError: the timeline has no forward/backward spans.
    """
    spans = [s for s in timeline.spans if "op" in s.args]
    if not spans:
        raise ValueError("no forward/backward spans (spans with an 'op' argument) in the timeline")
    start, end = min(s.start_ns for s in spans), max(s.end_ns for s in spans)
    busy = [0] * timeline.world_size
    for s in spans:  # a stage's forward and backward never overlap each other
        busy[s.rank] += s.end_ns - s.start_ns
    return [1.0 - b / max(end - start, 1) for b in busy]


def idle_fraction_theory(stage_times: Sequence[float]) -> list[float]:
    """Each rank's idle share when stages run one after the other: ``1 − t_r / Σ t``.

    With equal stages that is ``(p − 1)/p`` for every rank — GPipe's bubble
    ``(p − 1)/(m + p − 1)`` with one micro-batch (Huang et al. 2019, §2.3).

    Args:
        stage_times: per stage, its forward + backward time (any unit).

    Returns:
        list[float]: per rank.

    Raises:
        ValueError: no stages, a negative time, or all zero.
    """
    if not stage_times or min(stage_times) < 0 or sum(stage_times) <= 0:
        raise ValueError(f"need non-negative stage times with a positive sum, got {stage_times}")
    total = sum(stage_times)
    return [1.0 - t / total for t in stage_times]
