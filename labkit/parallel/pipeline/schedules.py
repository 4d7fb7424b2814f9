"""Pipeline schedules as data: which action every rank runs in every time slot.

Introduced in notebooks/11_pipeline_parallel.ipynb.

A schedule is ``list[list[Action | None]]``: one list per rank, time slots aligned across
ranks, ``None`` for an idle slot (a bubble). ``Action(stage, op, microbatch)`` prints as
``"2F0"`` (stage 2, forward, micro-batch 0), the notation of torch's
``distributed/pipelining/schedules.py``. Stages are placed round-robin: stage ``s`` lives on
rank ``s % n_ranks``, so with ``v`` virtual stages per rank, rank ``r`` holds stages
``r, r + p, …, r + (v−1)p`` (Narayanan et al. 2021, §2.2).

A zero-bubble schedule (Qi et al. 2023) splits each backward in two: ``B`` then computes only
the input's gradient and a new op, ``W``, the weights' gradients, later. A schedule either has
a ``W`` for every backward (``splits_backward``) or none; the existing schedules have none, and
their ``B`` is the whole backward.

Time model: every action takes one slot, a backward as long as a forward (B = F). Each
generator lists every rank's actions in the order that rank runs them, and ``place`` puts
each action in the first slot where its rank is free and its inputs exist (the previous
stage's forward, the next stage's backward, both in an earlier slot). With B = F, GPipe and
1F1B both take ``2(m + p − 1)`` slots, a bubble of ``(p − 1)/(m + p − 1)`` (Huang et al.
2019, §2.3); interleaving ``v`` virtual stages shrinks it to ``(p − 1)/(v·m + p − 1)``.
This module imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Action",
    "Schedule",
    "format_schedule",
    "gpipe",
    "interleaved_one_f_one_b",
    "one_f_one_b",
    "place",
    "rank_of_stage",
    "splits_backward",
]

Op = Literal["F", "B", "W"]
OPS: tuple[str, ...] = ("F", "B", "W")


@dataclass(frozen=True, order=True)
class Action:
    """One unit of pipeline work: a forward or backward of one micro-batch on one stage.

    Attributes:
        stage: the pipeline stage (0 … n_stages − 1).
        op: ``"F"`` (forward); ``"B"`` (backward: input and weight gradients together, or the
            input gradient only in a schedule with ``W`` actions); ``"W"`` (weight gradients,
            Qi et al. 2023's W pass; torch's ``pipelining`` calls our split ``B`` ``"I"``).
        microbatch: the micro-batch index (0 … n_microbatches − 1).
    """

    stage: int
    op: Op
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.op}{self.microbatch}"


Schedule = list[list[Action | None]]


def rank_of_stage(stage: int, n_ranks: int) -> int:
    """The rank that holds ``stage`` under round-robin placement (stage ``s`` → ``s % p``).

    Args:
        stage: the pipeline stage.
        n_ranks: pipeline ranks ``p``.

    Returns:
        int: ``stage % n_ranks`` (Narayanan et al. 2021, §2.2 interleaved placement).

    Raises:
        ValueError: ``n_ranks`` < 1 or ``stage`` < 0.
    """
    if n_ranks < 1 or stage < 0:
        raise ValueError(f"need n_ranks ≥ 1 and stage ≥ 0, got {n_ranks=}, {stage=}")
    return stage % n_ranks


def splits_backward(schedule: Sequence[Sequence[Action | None]]) -> bool:
    """Whether the schedule has ``W`` actions, so that its ``B`` is the input gradient only.

    Args:
        schedule: per rank, the actions (``None`` entries are skipped).

    Returns:
        bool: True when any action's op is ``"W"``.
    """
    return any(a is not None and a.op == "W" for row in schedule for a in row)


def _needs(a: Action, n_stages: int) -> list[Action]:
    """The actions whose results ``a`` consumes (on whichever rank they run)."""
    if a.op == "W":  # the gradient B received and the activations F kept, on this rank
        return [Action(a.stage, "B", a.microbatch)]
    if a.op == "F":
        return [Action(a.stage - 1, "F", a.microbatch)] if a.stage > 0 else []
    needs = [Action(a.stage, "F", a.microbatch)]
    if a.stage < n_stages - 1:
        needs.append(Action(a.stage + 1, "B", a.microbatch))
    return needs


def place(orders: list[list[Action]], n_stages: int) -> Schedule:
    """Put each rank's ordered actions into aligned time slots, each as early as it can run.

    An action runs in slot ``t`` when it is next in its rank's order and everything it needs
    (``F`` of the previous stage; ``F`` of its own stage and ``B`` of the next for a ``B``;
    its own ``B`` for a ``W``) ran in a slot before ``t``. Unit time per action (B = F = W).

    Args:
        orders: per rank, the actions in the order that rank runs them.
        n_stages: total stages (virtual stages included).

    Returns:
        Schedule: per rank, one entry per slot, ``None`` where the rank waits.

    Raises:
        ValueError: the orders deadlock (some rank waits for an action that never comes).
    """
    done_at: dict[Action, int] = {}
    nxt = [0] * len(orders)
    out: Schedule = [[] for _ in orders]
    t = 0
    while any(nxt[r] < len(o) for r, o in enumerate(orders)):
        progressed = False
        for r, order in enumerate(orders):
            a = order[nxt[r]] if nxt[r] < len(order) else None
            if a is not None and all(done_at.get(d, t) < t for d in _needs(a, n_stages)):
                out[r].append(a)
                nxt[r] += 1
                progressed = True
            else:
                out[r].append(None)
        for r in range(len(orders)):
            if out[r][t] is not None:
                done_at[out[r][t]] = t
        if not progressed:
            stuck = {r: str(o[nxt[r]]) for r, o in enumerate(orders) if nxt[r] < len(o)}
            raise ValueError(f"the per-rank orders deadlock at slot {t}; next actions: {stuck}")
        t += 1
    for row in out:  # trailing idle slots: every rank ends at the same slot
        row.extend([None] * (t - len(row)))
    return out


def _check(n_ranks: int, n_microbatches: int) -> None:
    if n_ranks < 1 or n_microbatches < 1:
        raise ValueError(f"need ≥ 1 rank and ≥ 1 micro-batch, got {n_ranks=}, {n_microbatches=}")


def gpipe(n_stages: int, n_microbatches: int) -> Schedule:
    """GPipe: every micro-batch forward through all stages, then every backward.

    One stage per rank. Huang et al. 2019 (GPipe), §2.3: with ``p`` stages and ``m``
    micro-batches the bubble is ``(p − 1)/(m + p − 1)`` of the time, and every stage holds
    the activations of all ``m`` micro-batches before its first backward.

    Args:
        n_stages: pipeline stages = ranks ``p``.
        n_microbatches: micro-batches ``m``.

    Returns:
        Schedule: ``2(m + p − 1)`` slots per rank (B = F).

    Raises:
        ValueError: ``n_stages`` or ``n_microbatches`` < 1.
    """
    _check(n_stages, n_microbatches)
    m = n_microbatches
    orders = [
        [Action(s, "F", i) for i in range(m)] + [Action(s, "B", i) for i in range(m)]
        for s in range(n_stages)
    ]
    return place(orders, n_stages)


def one_f_one_b(n_stages: int, n_microbatches: int) -> Schedule:
    """1F1B (PipeDream-Flush): a few warm-up forwards, then alternate one forward, one backward.

    Rank ``r`` of ``p`` runs ``min(p − 1 − r, m)`` warm-up forwards, then one forward and
    one backward in turn, then the remaining backwards (Narayanan et al. 2021, §2.1, Fig. 4).
    Same bubble as GPipe, but stage ``r`` holds at most ``p − r`` micro-batches' activations
    instead of ``m``.

    Args:
        n_stages: pipeline stages = ranks ``p``.
        n_microbatches: micro-batches ``m``.

    Returns:
        Schedule: ``2(m + p − 1)`` slots per rank (B = F).

    Raises:
        ValueError: ``n_stages`` or ``n_microbatches`` < 1.
    """
    _check(n_stages, n_microbatches)
    p, m = n_stages, n_microbatches
    orders = []
    for s in range(p):
        warmup = min(p - 1 - s, m)
        order = [Action(s, "F", i) for i in range(warmup)]
        for i in range(m - warmup):  # steady state: F of i + warmup, then B of i
            order += [Action(s, "F", i + warmup), Action(s, "B", i)]
        order += [Action(s, "B", i) for i in range(m - warmup, m)]
        orders.append(order)
    return place(orders, p)


def interleaved_one_f_one_b(n_ranks: int, n_microbatches: int, n_virtual: int) -> Schedule:
    """Interleaved 1F1B: ``v`` virtual stages per rank, micro-batches in groups of ``p``.

    ``p·v`` stages; rank ``r`` holds stages ``r, r + p, …``. Each rank runs the order of
    Megatron-LM's interleaved schedule (Narayanan et al. 2021, §2.2): its k-th forward is
    micro-batch ``(k // pv)·p + k % p`` on its local chunk ``(k // p) % v``, backwards take
    the chunks in reverse, after ``2(p − 1 − r) + (v − 1)p`` warm-up forwards. A slot is one
    chunk's forward or backward (1/v of a full stage), so the bubble is
    ``(p − 1)/(v·m + p − 1)``: v times smaller relative to the work.

    Args:
        n_ranks: pipeline ranks ``p``.
        n_microbatches: micro-batches ``m``, a multiple of ``p``.
        n_virtual: virtual stages (model chunks) per rank ``v``.

    Returns:
        Schedule: ``2(v·m + p − 1)`` slots per rank when ``m`` is a multiple of ``p``.

    Raises:
        ValueError: a count < 1, or ``m`` not a multiple of ``p`` (Megatron's requirement).
    """
    _check(n_ranks, n_microbatches)
    p, m, v = n_ranks, n_microbatches, n_virtual
    if v < 1:
        raise ValueError(f"need n_virtual ≥ 1, got {v}")
    if m % p:
        raise ValueError(f"interleaved 1F1B needs n_microbatches ({m}) to be a multiple of {p=}")
    total = m * v  # actions of each kind per rank

    def stage_of(r: int, k: int, op: str) -> Action:
        chunk = (k // p) % v
        if op == "B":
            chunk = v - 1 - chunk
        return Action(r + chunk * p, op, (k // (p * v)) * p + k % p)  # type: ignore[arg-type]

    orders = []
    for r in range(p):
        warmup = min(2 * (p - 1 - r) + (v - 1) * p, total)
        order = [stage_of(r, k, "F") for k in range(warmup)]
        for k in range(total - warmup):
            order += [stage_of(r, k + warmup, "F"), stage_of(r, k, "B")]
        order += [stage_of(r, k, "B") for k in range(total - warmup, total)]
        orders.append(order)
    return place(orders, p * v)


def format_schedule(schedule: Schedule, width: int = 4) -> str:
    """The schedule as a text grid: one row per rank, one column per slot, ``.`` when idle.

    Args:
        schedule: per rank, one entry per slot.
        width: characters per column.

    Returns:
        str: lines ``"rank 0 | 0F0 0F1 …"``.
    """
    lines = []
    for r, row in enumerate(schedule):
        cells = "".join(f"{('.' if a is None else str(a)):<{width}}" for a in row)
        lines.append(f"rank {r} | {cells}".rstrip())
    return "\n".join(lines)
