"""Exercises of notebooks/11_pipeline_parallel.ipynb.

Introduced in notebooks/11_pipeline_parallel.ipynb.

``11_gpipe_schedule``: write the GPipe schedule as data (Huang et al. 2019, §2.2–2.3): every
micro-batch's forward through all stages, then every backward, each action in the first slot
where its inputs exist. The checker needs no processes: for several stage and micro-batch
counts it runs ``labkit.parallel.pipeline.validate`` on the learner's schedule, checks that
each rank runs all its forwards before its first backward (GPipe, not 1F1B), and that the
step takes the optimal ``2(m + p − 1)`` slots, i.e. the bubble is ``(p − 1)/(m + p − 1)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labkit.exercises import ExerciseFailed, exercise
from labkit.parallel.pipeline import (
    Schedule,
    ScheduleError,
    bubble_fraction,
    bubble_fraction_theory,
    format_schedule,
    gpipe,
    validate,
)

CASES = ((1, 1), (2, 1), (2, 4), (3, 5), (4, 8), (4, 2))  # (n_stages, n_microbatches)

PROMPT = """Write `my_gpipe(n_stages, n_microbatches)` returning one list per rank (rank r holds
stage r) of `Action(stage, op, microbatch)` or `None` (idle), one entry per time slot, each
action taking one slot. Rank r runs forward of micro-batch i in slot r + i; the last stage
starts the backwards right after its last forward, and backward of micro-batch i on stage s
comes one slot after that on stage s + 1."""


def _last_busy(schedule: Schedule) -> int:
    return max((t + 1 for row in schedule for t, a in enumerate(row) if a is not None), default=0)


def _check_one(fn: Callable[[int, int], Any], p: int, m: int) -> None:
    try:
        schedule = fn(p, m)
    except NotImplementedError:
        raise
    except Exception as exc:  # a learner's bug: report it as a failed check
        raise ExerciseFailed(f"my_gpipe({p}, {m}) raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(schedule, list) or len(schedule) != p:
        raise ExerciseFailed(
            f"my_gpipe({p}, {m}) should return a list with one row per rank ({p}), "
            f"got {type(schedule).__name__} {str(schedule)[:80]}"
        )
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
    if _last_busy(schedule) != want:
        raise ExerciseFailed(
            f"with {p} stages and {m} micro-batches your schedule takes {_last_busy(schedule)} "
            f"slots, GPipe takes 2(m + p − 1) = {want}: bubble {bubble_fraction(schedule):.3f} "
            f"instead of (p − 1)/(m + p − 1) = {bubble_fraction_theory(p, m):.3f}. Start each "
            f"action as soon as its input exists\n{shown}"
        )


@exercise("11_gpipe_schedule", reference=gpipe, prompt=PROMPT)
def check_gpipe_schedule(fn: Callable[[int, int], Any]) -> dict[str, Any]:
    """Check a GPipe schedule generator: valid, all forwards first, ``2(m + p − 1)`` slots.

    Introduced in notebooks/11_pipeline_parallel.ipynb.

    Args:
        fn: the learner's ``fn(n_stages, n_microbatches)`` returning a schedule.

    Returns:
        ``{"cases": [(p, m), ...]}``: what was checked.

    Raises:
        ExerciseFailed: the schedule breaks a validator rule, interleaves forwards and
            backwards, or is longer than GPipe's; the message shows the grid.
        NotImplementedError: not attempted yet (``check`` then runs the reference).
    """
    for p, m in CASES:
        _check_one(fn, p, m)
    return {"cases": [list(c) for c in CASES]}
