"""The time of one 1F1B pipeline step, by playing the schedule through: stages, hops, bubble.

Introduced in notebooks/17_capstone.ipynb.

The bubble formula (p − 1)/(m + p − 1) (GPipe, Huang et al. 2019, §2.3) assumes equal stages
and free hops. Real stages differ (TinyGPT's first stage holds the embedding, its last the
head and the loss) and every hop costs a message. ``pipeline_time`` plays 1F1B (Narayanan et
al. 2021, §2.1: stage s runs min(p − 1 − s, m) warm-up forwards, then one forward and one
backward in turn, then the remaining backwards; ``labkit.parallel.pipeline.one_f_one_b``'s
order) with each stage's own forward and backward time: an action starts when its stage is
free and its input has arrived (the forward of the stage before, or the backward of the
stage after, plus one hop). With equal stages and free hops it gives (m + p − 1)(F + B),
the formula's step.

Pure arithmetic, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PipelineTime", "one_f_one_b_order", "pipeline_time"]


def one_f_one_b_order(n_stages: int, stage: int, m: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s actions under 1F1B: ``[("F", 0), ..., ("B", m − 1)]``.

    Raises:
        ValueError: a stage outside the pipeline or m < 1.
    """
    if not 0 <= stage < n_stages or m < 1:
        raise ValueError(f"need 0 <= stage < {n_stages} and m >= 1, got {stage}, {m}")
    warmup = min(n_stages - 1 - stage, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", i + warmup), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


@dataclass(frozen=True)
class PipelineTime:
    """``pipeline_time``'s result.

    Attributes:
        step_s: from the first forward's start to the last backward's end.
        busy_s: per stage, the time it computed.
        idle_s: per stage, step_s − busy_s: its share of the bubble (hops included).
    """

    step_s: float
    busy_s: tuple[float, ...]

    @property
    def idle_s(self) -> tuple[float, ...]:
        return tuple(self.step_s - b for b in self.busy_s)


def pipeline_time(
    forward_s: Sequence[float], backward_s: Sequence[float], m: int, hop_s: float = 0.0
) -> PipelineTime:
    """Play 1F1B over stages with the given per-micro-batch times.

    Args:
        forward_s: per stage, one micro-batch's forward (seconds).
        backward_s: per stage, one micro-batch's backward.
        m: micro-batches.
        hop_s: the time from the end of an action to its output's arrival at the next stage
            (a message: activations forward, their gradients backward).

    Returns:
        A ``PipelineTime``.

    Raises:
        ValueError: stages of different counts, none, or m < 1.
    """
    p = len(forward_s)
    if p < 1 or len(backward_s) != p or m < 1:
        raise ValueError(f"need as many forward as backward times (>= 1) and m >= 1, got {p}")
    orders = [one_f_one_b_order(p, s, m) for s in range(p)]
    end: dict[tuple[str, int, int], float] = {}  # (op, stage, micro-batch) -> end time
    free, nxt = [0.0] * p, [0] * p
    while any(nxt[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if nxt[s] == len(orders[s]):
                continue
            op, i = orders[s][nxt[s]]
            if op == "F":
                dep = ("F", s - 1, i) if s > 0 else None
            else:
                dep = ("B", s + 1, i) if s < p - 1 else ("F", s, i)
            if dep is not None and dep not in end:
                continue
            ready = 0.0 if dep is None else end[dep] + (hop_s if dep[1] != s else 0.0)
            start = max(free[s], ready)
            free[s] = end[(op, s, i)] = start + (forward_s[s] if op == "F" else backward_s[s])
            nxt[s] += 1
            moved = True
        if not moved:  # 1F1B never gets here; a guard against a broken order
            raise RuntimeError("pipeline schedule deadlocked")
    busy = tuple(m * (forward_s[s] + backward_s[s]) for s in range(p))
    return PipelineTime(max(free), busy)
