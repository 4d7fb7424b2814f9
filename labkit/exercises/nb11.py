"""Exercises of notebooks/11_pipeline_parallel.ipynb.

Introduced in notebooks/11_pipeline_parallel.ipynb.

``11_gpipe_slots``: derive GPipe's timing (Huang et al. 2019, §2.2–2.3). The learner writes
``slot(stage, op, microbatch, n_stages, n_microbatches)``, the time slot in which GPipe runs
each forward (``"F"``) and backward (``"B"``), from the dependency rules alone — the prompt
gives no formula. The checker needs no processes: for several stage and micro-batch counts it
lays every action into its slot (two actions of one rank in one slot fail), runs
``labkit.parallel.pipeline.validate`` on the result, checks that each rank runs all its
forwards before its first backward (GPipe, not 1F1B), and that the step takes the optimal
``2(m + p − 1)`` slots, i.e. the bubble is ``(p − 1)/(m + p − 1)``.

``11_zb_h1``: order a zero-bubble pipeline (Qi et al. 2023, §3.1, ZB-H1). The learner writes
``orders(n_stages, n_microbatches)``: per rank, its forwards ``F``, input-backwards ``B`` and
weight-backwards ``W`` in the order it runs them. The checker places them in slots
(``labkit.parallel.pipeline.place``: each action as early as its rank and inputs allow), runs
the validator, and wants, for several ``p`` and ``m`` (``m < p`` among them), the step of
ZB-H1 — ``2m + p − 1 + max(m, p)`` slots — with no stage holding more than ``min(p, m)``
micro-batches' activations (from ``F`` to ``W``: 1F1B's bound). Running each ``W`` right after
its ``B`` is too slow, all ``W``'s at the end hold too much, a ``W`` before its ``B`` or a
missing ``W`` is refused with the rule it breaks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labkit.exercises import ExerciseFailed, exercise
from labkit.parallel.pipeline import (
    Action,
    Schedule,
    ScheduleError,
    bubble_fraction,
    bubble_fraction_theory,
    format_schedule,
    peak_in_flight,
    place,
    validate,
    zb_h1_bubble_fraction,
    zb_h1_orders,
    zb_h1_slots,
)

CASES = ((1, 1), (2, 1), (2, 4), (3, 5), (4, 8), (4, 2))  # (n_stages, n_microbatches)

PROMPT = """Write `my_gpipe_slot(stage, op, microbatch, n_stages, n_microbatches)`: the time slot
(0, 1, ...) in which GPipe runs `Action(stage, op, microbatch)`, op "F" or "B", for any number
of stages p and micro-batches m. Derive it from the rules: every action takes one slot and a
rank (rank r holds stage r) runs one action per slot; a forward on stage s needs the forward of
the same micro-batch on stage s - 1 in an earlier slot; a backward on stage s needs the
backward on stage s + 1 in an earlier slot (on the last stage: its own forward); GPipe runs all
of a stage's forwards before its backwards, and every action as early as the rules allow."""


def gpipe_slot(stage: int, op: str, microbatch: int, n_stages: int, n_microbatches: int) -> int:
    """Reference solution of ``11_gpipe_slots``: the slot of one GPipe action.

    Forward of micro-batch i on stage s: slot s + i (stage s can start once s − 1 has run it;
    the last forward ends the fill at slot m + p − 2). The last stage's backwards follow its
    forwards from slot m + p − 1, and each earlier stage runs a backward one slot after the
    stage behind it: backward of i on stage s in slot (m + p − 1) + (p − 1 − s) + i.

    Args:
        stage: s, 0 ≤ s < p.
        op: ``"F"`` or ``"B"``.
        microbatch: i, 0 ≤ i < m.
        n_stages: p.
        n_microbatches: m.

    Returns:
        The slot index.
    """
    p, m = n_stages, n_microbatches
    if op == "F":
        return stage + microbatch
    return (m + p - 1) + (p - 1 - stage) + microbatch


def _schedule_from_slots(fn: Callable[..., Any], p: int, m: int) -> Schedule:
    """Lay every action into the slot ``fn`` gives; fail on a bad slot or a collision."""
    placed: dict[tuple[int, int], Action] = {}
    for s in range(p):
        for op in ("F", "B"):
            for i in range(m):
                a = Action(s, op, i)
                try:
                    t = fn(s, op, i, p, m)
                except NotImplementedError:
                    raise
                except Exception as exc:  # a learner's bug: report it as a failed check
                    raise ExerciseFailed(
                        f"my_gpipe_slot({s}, {op!r}, {i}, {p}, {m}) raised "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                    raise ExerciseFailed(
                        f"my_gpipe_slot({s}, {op!r}, {i}, {p}, {m}) returned {t!r}: a slot is "
                        "an int >= 0"
                    )
                if (s, t) in placed:
                    raise ExerciseFailed(
                        f"with {p} stages and {m} micro-batches rank {s} gets two actions in "
                        f"slot {t}: {placed[(s, t)]} and {a}. A rank runs one action per slot"
                    )
                placed[(s, t)] = a
    length = max(t for _, t in placed) + 1
    rows: Schedule = [[None] * length for _ in range(p)]
    for (s, t), a in placed.items():
        rows[s][t] = a
    return rows


def _check_one(fn: Callable[..., Any], p: int, m: int) -> None:
    schedule = _schedule_from_slots(fn, p, m)
    shown = format_schedule(schedule) if len(schedule[0]) <= 40 else "(too wide to show)"
    try:
        validate(schedule, p, m)
    except ScheduleError as exc:
        raise ExerciseFailed(f"with {p} stages and {m} micro-batches: {exc}\n{shown}") from exc
    for r, row in enumerate(schedule):
        ops = [a.op for a in row if a is not None]
        if "F" in ops[ops.index("B") :]:
            raise ExerciseFailed(
                f"with {p} stages and {m} micro-batches rank {r} runs a forward after a "
                f"backward: that is 1F1B; GPipe runs all forwards first\n{shown}"
            )
    want = 2 * (m + p - 1)
    if len(schedule[0]) != want:
        raise ExerciseFailed(
            f"with {p} stages and {m} micro-batches your schedule takes {len(schedule[0])} "
            f"slots, GPipe takes 2(m + p − 1) = {want}: bubble {bubble_fraction(schedule):.3f} "
            f"instead of (p − 1)/(m + p − 1) = {bubble_fraction_theory(p, m):.3f}. Start each "
            f"action as soon as its input exists\n{shown}"
        )


@exercise("11_gpipe_slots", reference=gpipe_slot, prompt=PROMPT)
def check_gpipe_slots(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check a derived GPipe slot function: valid, all forwards first, ``2(m + p − 1)`` slots.

    Args:
        fn: the learner's ``fn(stage, op, microbatch, n_stages, n_microbatches)`` → slot.

    Returns:
        ``{"cases": [[p, m], ...]}``: what was checked.

    Raises:
        ExerciseFailed: two actions of a rank share a slot, the schedule breaks a validator
            rule, interleaves forwards and backwards, or is longer than GPipe's; the message
            shows the grid.
        NotImplementedError: not attempted yet (``check`` then runs the reference).
    """
    for p, m in CASES:
        _check_one(fn, p, m)
    return {"cases": [list(c) for c in CASES]}


# ------------------------------------------------------------------------------ 11_zb_h1

ZB_CASES = ((2, 4), (4, 8), (4, 2), (3, 5), (4, 4), (5, 3), (1, 3))  # (p, m); m < p included

ZB_PROMPT = """Write `my_zb_h1_orders(n_stages, n_microbatches)`: for each rank r (holding stage
r), the list of its actions in the order it runs them — `Action(r, "F", i)`, `Action(r, "B", i)`
(the input's gradient) and `Action(r, "W", i)` (the weights' gradients) for every micro-batch i.
The check places them in slots, each as early as its rank and inputs allow (a W needs its own
B in an earlier slot), validates the schedule, and wants ZB-H1's step: 2m + p - 1 + max(m, p)
slots, with no stage holding more than min(p, m) micro-batches' activations at once (a
micro-batch's activations live from its F to its W). Keep 1F1B's order of F and B and find
where each W goes."""


def _zb_orders(fn: Callable[..., Any], p: int, m: int) -> list[list[Action]]:
    """Call the learner's function; fail unless it gives p lists of Actions."""
    try:
        orders = fn(p, m)
    except NotImplementedError:
        raise
    except Exception as exc:  # a learner's bug: report it as a failed check
        raise ExerciseFailed(
            f"my_zb_h1_orders({p}, {m}) raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(orders, list | tuple) or len(orders) != p:
        raise ExerciseFailed(
            f"my_zb_h1_orders({p}, {m}) returned {type(orders).__name__} of "
            f"{len(orders) if hasattr(orders, '__len__') else '?'} entries: give one list of "
            f"actions per rank ({p})"
        )
    for r, order in enumerate(orders):
        bad = [a for a in order if not isinstance(a, Action)]
        if bad:
            raise ExerciseFailed(
                f"with {p} stages and {m} micro-batches rank {r}'s order holds {bad[0]!r}: "
                "list only pp.Action(stage, op, microbatch) (no None: place adds the waits)"
            )
    return [list(o) for o in orders]


def _zb_counts(orders: list[list[Action]], p: int, m: int) -> None:
    """Every rank runs F, B and W of each micro-batch of its stage once, W after its B."""
    for r, order in enumerate(orders):
        for op in ("F", "B", "W"):
            got = sorted(a.microbatch for a in order if a.op == op and a.stage == r)
            if got != list(range(m)):
                missing = sorted(set(range(m)) - set(got))
                what = (
                    f"no {op} for micro-batch(es) {missing}"
                    if missing
                    else f"{op}'s of micro-batches {got} (each once, of stage {r})"
                )
                why = (
                    ": ZB-H1 splits every backward, so every B needs its W"
                    if op == "W" and missing
                    else ""
                )
                raise ExerciseFailed(
                    f"with {p} stages and {m} micro-batches rank {r} has {what}{why}"
                )
        at = {a: i for i, a in enumerate(order)}
        for i in range(m):
            if at[Action(r, "W", i)] < at[Action(r, "B", i)]:
                raise ExerciseFailed(
                    f"with {p} stages and {m} micro-batches rank {r} runs {r}W{i} before "
                    f"{r}B{i}: the weights' gradient needs the output's gradient that B "
                    "receives and uses ([weight-after-backward])"
                )


def _check_zb_one(fn: Callable[..., Any], p: int, m: int) -> None:
    orders = _zb_orders(fn, p, m)
    _zb_counts(orders, p, m)
    try:
        schedule = place(orders, p)
    except ValueError as exc:
        raise ExerciseFailed(f"with {p} stages and {m} micro-batches: {exc}") from exc
    shown = format_schedule(schedule) if len(schedule[0]) <= 40 else "(too wide to show)"
    try:
        validate(schedule, p, m)
    except ScheduleError as exc:
        raise ExerciseFailed(f"with {p} stages and {m} micro-batches: {exc}\n{shown}") from exc
    bound = min(p, m)
    for stage, peak in peak_in_flight(schedule).items():
        if peak > bound:
            raise ExerciseFailed(
                f"with {p} stages and {m} micro-batches stage {stage} holds {peak} "
                f"micro-batches' activations at once (each lives from its F to its W); ZB-H1 "
                f"holds at most min(p, m) = {bound}, as 1F1B does. Run the W's earlier\n{shown}"
            )
    want, got = zb_h1_slots(p, m), len(schedule[0])
    if got != want:
        raise ExerciseFailed(
            f"with {p} stages and {m} micro-batches your step takes {got} slots, ZB-H1 takes "
            f"2m + p − 1 + max(m, p) = {want}: bubble {bubble_fraction(schedule):.3f} instead of "
            f"{zb_h1_bubble_fraction(p, m):.3f}. A W that nobody waits for should fill a slot "
            f"where the rank would wait, not hold back a B the previous stage waits for\n{shown}"
        )


@exercise("11_zb_h1", reference=zb_h1_orders, prompt=ZB_PROMPT)
def check_zb_h1(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check per-rank ZB-H1 orders: valid once placed, ZB-H1's length, 1F1B's memory.

    Args:
        fn: the learner's ``fn(n_stages, n_microbatches)`` → per rank, a list of ``Action``.

    Returns:
        ``{"cases": [[p, m], ...]}``: what was checked.

    Raises:
        ExerciseFailed: the orders are malformed, miss or repeat an action, run a ``W`` before
            its ``B``, deadlock, break a validator rule, hold more than ``min(p, m)``
            micro-batches on a stage, or take another number of slots than ZB-H1; the
            message shows the grid.
        NotImplementedError: not attempted yet (``check`` then runs the reference).
    """
    for p, m in ZB_CASES:
        _check_zb_one(fn, p, m)
    return {"cases": [list(c) for c in ZB_CASES]}
