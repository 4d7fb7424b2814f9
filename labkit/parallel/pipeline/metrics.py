"""Bubble fraction and in-flight activations: from a schedule, from theory, from measurement.

Introduced in notebooks/11_pipeline_parallel.ipynb.

The bubble is the share of rank-time spent idle between a step's first action and its last.
From a schedule (unit-time slots) it is idle slots / (ranks × slots); in theory, for GPipe and
1F1B with ``p`` stages and ``m`` micro-batches, ``(p − 1)/(m + p − 1)`` (Huang et al. 2019,
§2.3), and ``(p − 1)/(v·m + p − 1)`` with ``v`` interleaved virtual stages (Narayanan et al.
2021, §2.2); for ZB-H1 with equal F, B and W, ``(p − 1)/(3m + p − 1)`` when ``m ≥ p`` (Qi et al.
2023, §3.1; ``labkit.parallel.pipeline.zero_bubble`` derives it); measured, the share of each
rank's wall time not covered by its action spans. This module imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from labkit.parallel.pipeline.schedules import Action, splits_backward

__all__ = [
    "bubble_fraction",
    "bubble_fraction_theory",
    "measured_bubble_fraction",
    "peak_in_flight",
    "peak_in_flight_theory",
    "zb_h1_bubble_fraction",
    "zb_h1_slots",
]


def bubble_fraction(schedule: Sequence[Sequence[Action | None]]) -> float:
    """Idle slots over all rank-slots, from the first slot to the last busy one.

    Args:
        schedule: per rank, one entry per slot (``None`` = idle).

    Returns:
        float: in [0, 1); 0 for an empty schedule.
    """
    end = max((t + 1 for row in schedule for t, a in enumerate(row) if a is not None), default=0)
    if end == 0:
        return 0.0
    busy = sum(a is not None for row in schedule for a in row[:end])
    return 1.0 - busy / (len(schedule) * end)


def bubble_fraction_theory(n_ranks: int, n_microbatches: int, n_virtual: int = 1) -> float:
    """The closed-form bubble of GPipe / 1F1B, or of interleaved 1F1B with ``v`` chunks.

    GPipe (Huang et al. 2019, §2.3): ``(p − 1)/(m + p − 1)`` of the total time, B = F;
    1F1B has the same; interleaving (Narayanan et al. 2021, §2.2) divides the bubble time by
    ``v``: ``(p − 1)/(v·m + p − 1)``.

    Args:
        n_ranks: pipeline ranks ``p``.
        n_microbatches: micro-batches ``m``.
        n_virtual: virtual stages per rank ``v`` (1 = not interleaved).

    Returns:
        float: the bubble's share of the total time.

    Raises:
        ValueError: a count < 1.
    """
    p, m, v = n_ranks, n_microbatches, n_virtual
    if min(p, m, v) < 1:
        raise ValueError(f"need p, m, v ≥ 1, got {p=}, {m=}, {v=}")
    return (p - 1) / (v * m + p - 1)


def zb_h1_slots(n_ranks: int, n_microbatches: int) -> int:
    """Slots of a ZB-H1 step with F = B = W = one slot: ``2m + p − 1 + max(m, p)``.

    Qi et al. 2023, §3.1. Rank 0 waits ``2p − 1`` slots for its first ``B`` (``p`` forwards
    and ``p − 1`` input-backwards of micro-batch 0 on the critical path), having run
    ``min(p, m)`` forwards meanwhile, then works without a gap: ``2p − 1 + 3m − min(p, m)``.

    Args:
        n_ranks: pipeline ranks ``p``.
        n_microbatches: micro-batches ``m``.

    Returns:
        int: ``3m + p − 1`` when ``m ≥ p``, ``2m + 2p − 1`` otherwise.

    Raises:
        ValueError: a count < 1.
    """
    p, m = n_ranks, n_microbatches
    if min(p, m) < 1:
        raise ValueError(f"need p, m ≥ 1, got {p=}, {m=}")
    return 2 * m + p - 1 + max(m, p)


def zb_h1_bubble_fraction(n_ranks: int, n_microbatches: int) -> float:
    """ZB-H1's bubble with F = B = W: ``(p − 1)/(3m + p − 1)`` when ``m ≥ p``.

    Qi et al. 2023, §3.1: ZB-H1 idles ``(p − 1)(T_F + T_B − T_W)`` per rank against 1F1B's
    ``(p − 1)(T_F + T_B + T_W)`` — with equal times ``p − 1`` slots against ``3(p − 1)``.

    Args:
        n_ranks: pipeline ranks ``p``.
        n_microbatches: micro-batches ``m``.

    Returns:
        float: ``1 − 3m / zb_h1_slots(p, m)``.

    Raises:
        ValueError: a count < 1.
    """
    return 1.0 - 3 * n_microbatches / zb_h1_slots(n_ranks, n_microbatches)


def peak_in_flight(schedule: Sequence[Sequence[Action | None]]) -> dict[int, int]:
    """Per stage, the most micro-batches whose forward ran and backward has not yet.

    Each such micro-batch keeps its activations alive on that stage (they are needed by the
    backward), so this is the activation memory in units of one micro-batch's activations.
    In a schedule with ``W`` actions a micro-batch stays in flight until its ``W``: the weight
    gradients need the stage's saved activations too (``split_backward``).

    Args:
        schedule: per rank, one entry per slot.

    Returns:
        dict[int, int]: stage → peak count.
    """
    last = "W" if splits_backward(schedule) else "B"
    live: dict[int, int] = {}
    peak: dict[int, int] = {}
    for row in schedule:
        for a in row:
            if a is None or a.op not in ("F", last):
                continue
            live[a.stage] = live.get(a.stage, 0) + (1 if a.op == "F" else -1)
            peak[a.stage] = max(peak.get(a.stage, 0), live[a.stage])
    return dict(sorted(peak.items()))


def peak_in_flight_theory(
    schedule_name: str, stage: int, n_stages: int, n_microbatches: int
) -> int:
    """The activation bound: GPipe holds all ``m``; 1F1B at most ``p − stage`` (≤ p).

    Narayanan et al. 2021, §2.1: 1F1B limits in-flight micro-batches to the pipeline depth.
    ZB-H1 (Qi et al. 2023, §3.1) holds ``min(p, m)`` on every stage, from F to W: 1F1B's peak.

    Args:
        schedule_name: ``"gpipe"``, ``"1f1b"`` or ``"zb_h1"``.
        stage: the stage (= rank).
        n_stages: stages ``p``.
        n_microbatches: micro-batches ``m``.

    Returns:
        int: ``m`` for GPipe, ``min(p − stage, m)`` for 1F1B, ``min(p, m)`` for ZB-H1.

    Raises:
        ValueError: an unknown schedule name.
    """
    if schedule_name == "gpipe":
        return n_microbatches
    if schedule_name == "1f1b":
        return min(n_stages - stage, n_microbatches)
    if schedule_name == "zb_h1":
        return min(n_stages, n_microbatches)
    raise ValueError(f"no closed form for {schedule_name!r}; known: 'gpipe', '1f1b', 'zb_h1'")


def _union_length(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def measured_bubble_fraction(timeline: Any) -> float:
    """The measured bubble: rank-time not covered by an action's span (F, B or W).

    Reads the spans the pipeline runtime records (those with an ``"op"`` argument, one per
    action) from a ``lk.trace.Timeline``; the window runs from the first action's start to
    the last action's end on any rank. Time in send/recv, waiting and Python overhead counts
    as bubble, so on CPU ranks the measured value sits above the schedule's.

    Args:
        timeline: a ``lk.trace.Timeline`` (anything with ``spans`` and ``world_size``).

    Returns:
        float: ``1 − busy / (ranks × window)``.

    Raises:
        ValueError: the timeline holds no action spans.
    """
    spans = [s for s in timeline.spans if "op" in s.args]
    if not spans:
        raise ValueError("no pipeline action spans (spans with an 'op' argument) in the timeline")
    start = min(s.start_ns for s in spans)
    end = max(s.end_ns for s in spans)
    busy = sum(
        _union_length([(s.start_ns, s.end_ns) for s in spans if s.rank == r])
        for r in range(timeline.world_size)
    )
    return 1.0 - busy / (timeline.world_size * max(end - start, 1))
