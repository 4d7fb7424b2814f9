"""Check a pipeline schedule's invariants without running anything.

Introduced in notebooks/11_pipeline_parallel.ipynb.

``validate(schedule, n_stages, n_microbatches)`` raises ``ScheduleError`` naming the rank,
the slot and the rule broken. The rules, in the order they are checked:

1. ``one-per-slot``: a slot holds ``None`` or one ``Action`` (a rank does one thing at a time).
2. ``known-action``: op is ``"F"``, ``"B"`` or ``"W"``, stage and micro-batch in range.
3. ``placement``: stage ``s`` runs on rank ``s % n_ranks`` (where its weights live).
4. ``exactly-once``: no action appears twice, none is missing — in a schedule with ``W``
   actions (a split backward, ``splits_backward``) every micro-batch's stage needs its ``W``.
5. ``stage-order``: ``F`` of stage ``s`` comes after ``F`` of stage ``s − 1`` (its input),
   and ``B`` of stage ``s`` after ``B`` of stage ``s + 1`` (its output's gradient), each in an
   earlier slot, because the result travels from another rank.
6. ``forward-before-backward``: on each stage, micro-batch i's ``F`` is in an earlier slot
   than its ``B`` (the backward needs the stored activations).
7. ``weight-after-backward``: on each stage, micro-batch i's ``W`` is in a later slot than its
   ``B`` (Qi et al. 2023, §2: W needs the output's gradient that B received and used).

torch's ``distributed/pipelining`` checks the same with private helpers in its tests
(``test_schedule.py``); this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from labkit.parallel.pipeline.schedules import OPS, Action, splits_backward

__all__ = ["ScheduleError", "validate"]


class ScheduleError(ValueError):
    """A schedule breaks a rule; ``rule``, ``rank`` and ``slot`` say which and where."""

    def __init__(self, rule: str, message: str, rank: int | None = None, slot: int | None = None):
        where = "" if rank is None else f"rank {rank}, slot {slot}: "
        super().__init__(f"[{rule}] {where}{message}")
        self.rule, self.rank, self.slot = rule, rank, slot


def _check_entry(
    entry: Any, r: int, t: int, n_ranks: int, n_stages: int, n_microbatches: int
) -> Action | None:
    if entry is None:
        return None
    if isinstance(entry, list | tuple | set):
        names = ", ".join(str(a) for a in entry)
        raise ScheduleError("one-per-slot", f"{len(entry)} actions in one slot ({names})", r, t)
    if not isinstance(entry, Action):
        raise ScheduleError("known-action", f"{entry!r} is neither an Action nor None", r, t)
    if entry.op not in OPS:
        raise ScheduleError("known-action", f"op {entry.op!r} of {entry} is not F, B or W", r, t)
    if not 0 <= entry.stage < n_stages or not 0 <= entry.microbatch < n_microbatches:
        raise ScheduleError(
            "known-action",
            f"{entry} is out of range ({n_stages} stages, {n_microbatches} micro-batches)",
            r,
            t,
        )
    if entry.stage % n_ranks != r:
        raise ScheduleError(
            "placement",
            f"{entry} runs stage {entry.stage}, which lives on rank {entry.stage % n_ranks}",
            r,
            t,
        )
    return entry


def validate(
    schedule: Sequence[Sequence[Any]], n_stages: int, n_microbatches: int
) -> dict[Action, tuple[int, int]]:
    """Check that a schedule can run and computes every gradient exactly once.

    The invariants of GPipe (Huang et al. 2019, §2.2), 1F1B (Narayanan et al. 2021, §2) and
    zero-bubble schedules (Qi et al. 2023, §2): see the module docstring for the seven rules.

    Args:
        schedule: per rank, one entry per slot (``Action`` or ``None``); rank ``r`` must hold
            stages ``r, r + p, …``.
        n_stages: total stages, a multiple of the number of ranks (virtual stages included).
        n_microbatches: micro-batches ``m``.

    Returns:
        dict: every action → ``(rank, slot)`` where it runs.

    Raises:
        ScheduleError: the first rule broken, with the rank and slot where it shows.
        ValueError: no ranks, or ``n_stages`` not a positive multiple of the rank count.
    """
    n_ranks = len(schedule)
    if n_ranks == 0 or n_stages < 1 or n_stages % n_ranks or n_microbatches < 1:
        raise ValueError(
            f"need ≥ 1 rank, n_stages ({n_stages}) a positive multiple of the rank count "
            f"({n_ranks}) and ≥ 1 micro-batch ({n_microbatches})"
        )
    where: dict[Action, tuple[int, int]] = {}
    for r, row in enumerate(schedule):
        for t, entry in enumerate(row):
            a = _check_entry(entry, r, t, n_ranks, n_stages, n_microbatches)
            if a is None:
                continue
            if a in where:
                r0, t0 = where[a]
                raise ScheduleError(
                    "exactly-once", f"{a} appears twice (first at rank {r0}, slot {t0})", r, t
                )
            where[a] = (r, t)
    ops = OPS if splits_backward(schedule) else ("F", "B")
    for s in range(n_stages):
        for op in ops:
            for i in range(n_microbatches):
                a = Action(s, op, i)  # type: ignore[arg-type]
                if a not in where:
                    raise ScheduleError(
                        "exactly-once", f"{a} is missing (rank {s % n_ranks} never runs it)"
                    )
    for a, (r, t) in sorted(where.items(), key=lambda kv: kv[1][1]):
        if a.op == "F" and a.stage > 0:
            before = Action(a.stage - 1, "F", a.microbatch)
            if where[before][1] >= t:
                raise ScheduleError(
                    "stage-order",
                    f"{a} needs the output of {before}, which runs in slot {where[before][1]}",
                    r,
                    t,
                )
        if a.op == "W":
            bwd = Action(a.stage, "B", a.microbatch)
            if where[bwd][1] >= t:
                raise ScheduleError(
                    "weight-after-backward",
                    f"{a} needs the gradient {bwd} received, which runs in slot {where[bwd][1]}",
                    r,
                    t,
                )
        if a.op == "B":
            fwd = Action(a.stage, "F", a.microbatch)
            if where[fwd][1] >= t:
                raise ScheduleError(
                    "forward-before-backward",
                    f"{a} needs the activations of {fwd}, which runs in slot {where[fwd][1]}",
                    r,
                    t,
                )
            if a.stage < n_stages - 1:
                after = Action(a.stage + 1, "B", a.microbatch)
                if where[after][1] >= t:
                    raise ScheduleError(
                        "stage-order",
                        f"{a} needs the gradient from {after}, which runs in slot "
                        f"{where[after][1]}",
                        r,
                        t,
                    )
    return where
