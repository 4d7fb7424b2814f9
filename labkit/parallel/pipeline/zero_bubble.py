"""ZB-H1, the zero-bubble schedule with 1F1B's memory, as data.

Introduced in notebooks/11_pipeline_parallel.ipynb.

Qi et al. 2023, "Zero Bubble Pipeline Parallelism" (ICLR 2024), §3: split each backward into
``B`` (the input's gradient, which the previous stage waits for) and ``W`` (the weights'
gradients, which nobody waits for). ZB-H1 keeps 1F1B's order of ``F`` and ``B`` and delays
``W``: rank ``r`` runs its first ``W`` only after ``r + 1`` backwards, so each later ``W``
fills a slot where 1F1B would have waited. Per rank ``r`` of ``p`` with ``m`` micro-batches:

    warm-up   min(p − 1 − r, m) forwards
    steady    F(k + warm-up), B(k), and W(next) once k ≥ r      (k = 0 … m − warm-up − 1)
    cool-down B(k), and W(next) once k ≥ r
    then      the remaining W's

This is torch's ``ScheduleInterleavedZeroBubble`` with one stage per rank, action for action
(``tests/test_pipeline_zero_bubble.py`` compares the two).

**Its bubble, F = B = W = one slot.** Every rank works ``3m`` slots. Micro-batch 0 crosses
``p`` forwards and then ``p`` input-backwards one rank after another, so rank 0 runs its first
``B`` in slot ``2p − 1``; before that it can only run forwards — ``min(p, m)`` of them (1F1B's
in-flight limit) — so it idles ``2p − 1 − min(p, m)`` slots, and never again (the delayed
``W``'s fill every later gap). The step takes ``2m + p − 1 + max(m, p)`` slots: for ``m ≥ p``,
``3m + p − 1``, a bubble of ``(p − 1)/(3m + p − 1)``. 1F1B with the same costs (its backward
``B + W`` is two slots) takes ``3(m + p − 1)``: ``3(p − 1)`` idle slots per rank against
ZB-H1's ``p − 1`` — a third of 1F1B's bubble time (the paper's ``(p − 1)(T_F + T_B + T_W)``
against ``(p − 1)(T_F + T_B − T_W)``), while 1F1B's fraction stays ``(p − 1)/(m + p − 1)``.

Memory: a micro-batch's activations live from its ``F`` to its ``W``. Rank ``r`` delays
``r`` ``W``'s on top of its ``p − 1 − r`` warm-up forwards, so every rank holds at most
``min(p, m)`` — 1F1B's peak (on its first rank), as the paper's ZB-H1 is designed to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from labkit.parallel.pipeline.schedules import Action, Schedule, place

__all__ = ["actions_from_torch", "zb_h1", "zb_h1_orders"]


def zb_h1_orders(n_stages: int, n_microbatches: int) -> list[list[Action]]:
    """Each rank's ZB-H1 actions in the order it runs them (before placing them in slots).

    Args:
        n_stages: pipeline stages = ranks ``p`` (one stage per rank).
        n_microbatches: micro-batches ``m``.

    Returns:
        list[list[Action]]: per rank, ``3m`` actions (``F``, ``B`` = input grad, ``W``).

    Raises:
        ValueError: ``n_stages`` or ``n_microbatches`` < 1.
    """
    if n_stages < 1 or n_microbatches < 1:
        raise ValueError(f"need ≥ 1 stage and ≥ 1 micro-batch, got {n_stages=}, {n_microbatches=}")
    p, m = n_stages, n_microbatches
    orders = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        order = [Action(r, "F", i) for i in range(warmup)]
        n_w = 0
        for k in range(m):  # the k-th backward, with the forward that 1F1B pairs with it
            if k + warmup < m:
                order.append(Action(r, "F", k + warmup))
            order.append(Action(r, "B", k))
            if k >= r:  # rank r delays its first W by r backwards
                order.append(Action(r, "W", n_w))
                n_w += 1
        order += [Action(r, "W", i) for i in range(n_w, m)]
        orders.append(order)
    return orders


def zb_h1(n_stages: int, n_microbatches: int) -> Schedule:
    """ZB-H1 (Qi et al. 2023, §3.1): 1F1B's memory, a third of its bubble (F = B = W).

    Args:
        n_stages: pipeline stages = ranks ``p``.
        n_microbatches: micro-batches ``m``.

    Returns:
        Schedule: ``2m + p − 1 + max(m, p)`` slots per rank (``3m + p − 1`` when ``m ≥ p``),
        with ``F``, ``B`` (input gradient) and ``W`` (weight gradients) actions.

    Raises:
        ValueError: ``n_stages`` or ``n_microbatches`` < 1.
    """
    return place(zb_h1_orders(n_stages, n_microbatches), n_stages)


_TORCH_OPS = {"F": "F", "I": "B", "W": "W", "B": "B"}  # torch's I = our split B


def actions_from_torch(pipeline_order: Mapping[int, Sequence[Any]]) -> list[list[Action]]:
    """A torch ``pipelining`` schedule's compute order as labkit actions, rank by rank.

    torch's ``_PipelineScheduleRuntime`` subclasses keep ``pipeline_order``: rank → list of
    ``_Action(stage_index, computation_type, microbatch_index)`` or None; its ``"I"``
    (backward input) is our split ``B``, its ``"W"`` our ``W``, its ``"B"`` a whole backward.
    Read by attribute, so this imports no torch.

    Args:
        pipeline_order: ``schedule.pipeline_order`` of a torch schedule object.

    Returns:
        list[list[Action]]: per rank, its compute actions in order (torch's ``None``
        placeholders and communication actions dropped).
    """
    out = []
    for rank in sorted(pipeline_order):
        row = []
        for a in pipeline_order[rank]:
            if a is None:
                continue
            op = _TORCH_OPS.get(str(getattr(a.computation_type, "value", a.computation_type)))
            if op is not None:
                row.append(Action(a.stage_index, op, a.microbatch_index))  # type: ignore[arg-type]
        out.append(row)
    return out
