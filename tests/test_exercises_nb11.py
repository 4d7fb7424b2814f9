"""Tests for labkit/exercises/nb11.py: the reference passes, wrong schedules fail with a reason."""

from __future__ import annotations

import pytest

import labkit as lk
from labkit.exercises import ExerciseFailed, nb11
from labkit.parallel.pipeline import Action, one_f_one_b, place

NAME = "11_gpipe_schedule"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is lk.parallel.pipeline.gpipe
    assert ex.checker(ex.reference) == {"cases": [list(c) for c in nb11.CASES]}


def test_a_hand_written_gpipe_with_backwards_in_reverse_passes() -> None:
    def by_slots(p, m):  # slot arithmetic, last micro-batch's backward first
        rows = [[None] * (2 * (m + p - 1)) for _ in range(p)]
        for s in range(p):
            for i in range(m):
                rows[s][s + i] = Action(s, "F", i)
                rows[s][m + p - 1 + (p - 1 - s) + i] = Action(s, "B", m - 1 - i)
        return rows

    assert lk.exercises.check(NAME, by_slots).status == "passed"


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(n_stages, n_microbatches):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _backward_too_early(p, m):
    """Stages before the last start their backwards one slot early: no gradient yet."""
    rows = [[None] * (2 * (m + p - 1)) for _ in range(p)]
    for s in range(p):
        for i in range(m):
            rows[s][s + i] = Action(s, "F", i)
            early = 1 if s < p - 1 else 0
            rows[s][m + p - 1 - early + (p - 1 - s) + i] = Action(s, "B", i)
    return rows


def _all_start_at_once(p, m):
    """Every stage starts micro-batch 0 in slot 0: stage s has no input yet."""
    return [[Action(s, "F", i) for i in range(m)] + [Action(s, "B", i) for i in range(m)]
            for s in range(p)]  # fmt: skip


def _no_overlap(p, m):
    """Stages take turns: correct but a stage idles while the others work."""
    orders = [[Action(s, "F", i) for i in range(m)] for s in range(p)]
    rows = place(orders, p)
    for r in range(p):
        rows[r] += [None] * ((p - 1 - r) * m)
        rows[r] += [Action(r, "B", i) for i in range(m)]
    return rows


def _forgets_a_microbatch(p, m):
    return [[a if a is None or a.microbatch < m - 1 else None for a in row]
            for row in lk.parallel.pipeline.gpipe(p, m)]  # fmt: skip


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (_backward_too_early, r"\[stage-order\] rank 0, slot 2: 0B0 needs the gradient from 1B0"),
        (_all_start_at_once, r"\[stage-order\].*1F0 needs the output of 0F0"),
        (_no_overlap, r"takes \d+ slots, GPipe takes 2\(m \+ p − 1\)"),
        (one_f_one_b, "that is 1F1B"),
        (_forgets_a_microbatch, r"\[exactly-once\] .* is missing"),
        (lambda p, m: None, "one row per rank"),
    ],
    ids=["backward-early", "no-stage-order", "no-overlap", "1f1b", "missing", "none"],
)
def test_wrong_answers_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)
