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
    validate,
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
