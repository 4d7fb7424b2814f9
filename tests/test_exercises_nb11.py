"""Tests for labkit/exercises/nb11.py: the derived slots pass, plausible wrong ones fail."""

from __future__ import annotations

import pytest

import labkit as lk
from labkit.exercises import ExerciseFailed, nb11
from labkit.parallel.pipeline import gpipe, one_f_one_b

NAME = "11_gpipe_slots"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb11.gpipe_slot
    assert ex.checker(ex.reference) == {"cases": [list(c) for c in nb11.CASES]}


@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 3), (4, 4), (4, 8), (5, 2)])
def test_reference_slots_are_where_labkit_gpipe_puts_each_action(p: int, m: int) -> None:
    for s, row in enumerate(gpipe(p, m)):
        for t, a in enumerate(row):
            if a is not None:
                assert nb11.gpipe_slot(a.stage, a.op, a.microbatch, p, m) == t, (a, t)
                assert a.stage == s


def test_prompt_gives_no_formula() -> None:
    prompt = lk.exercises.get(NAME).prompt
    assert "r + i" not in prompt and "m + p" not in prompt and "one slot after" not in prompt


def test_backwards_in_reverse_micro_batch_order_pass() -> None:
    def reverse(s, op, i, p, m):
        return s + i if op == "F" else (m + p - 1) + (p - 1 - s) + (m - 1 - i)

    assert lk.exercises.check(NAME, reverse).status == "passed"


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(stage, op, microbatch, n_stages, n_microbatches):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _slots_of(schedule_fn):
    """A slot function read off a schedule generator (e.g. 1F1B)."""

    def slot(s, op, i, p, m):
        row = schedule_fn(p, m)[s]
        return next(
            t for t, a in enumerate(row) if a is not None and (a.op, a.microbatch) == (op, i)
        )

    return slot


WRONG = {
    # Backwards drain from stage 0 up: stage 0 runs B0 before stage 1 has its gradient.
    "drain-wrong-way": (
        lambda s, op, i, p, m: s + i if op == "F" else m + s + i,
        r"\[stage-order\] .* needs the gradient from",
    ),
    # No fill: every stage starts micro-batch 0 in slot 0.
    "no-fill": (
        lambda s, op, i, p, m: i if op == "F" else m + (p - 1 - s) + i,
        r"\[stage-order\] .* needs the output of",
    ),
    # Forgot the drain offset: every stage runs B_i in the same slot.
    "no-drain-offset": (
        lambda s, op, i, p, m: s + i if op == "F" else m + p - 1 + i,
        r"\[stage-order\] .* needs the gradient from",
    ),
    # Backwards one slot early: the last stage's B0 lands on its last forward.
    "one-slot-early": (
        lambda s, op, i, p, m: s + i if op == "F" else m + p - 2 + (p - 1 - s) + i,
        r"gets two actions in slot \d+",
    ),
    # One idle slot between the phases: valid but not GPipe's length.
    "idle-between-phases": (
        lambda s, op, i, p, m: s + i if op == "F" else m + p + (p - 1 - s) + i,
        r"takes \d+ slots, GPipe takes 2\(m \+ p − 1\)",
    ),
    # Stages take turns: stage s waits until stage s - 1 has run every forward.
    "no-overlap": (
        lambda s, op, i, p, m: s * m + i if op == "F" else p * m + (p - 1 - s) * m + i,
        r"takes \d+ slots, GPipe takes 2\(m \+ p − 1\)",
    ),
    "1f1b": (_slots_of(one_f_one_b), "that is 1F1B"),
    "float-slot": (lambda s, op, i, p, m: float(s + i) if op == "F" else 0.0, "a slot is an int"),
    "raises": (lambda s, op, i, p, m: [][0], "raised IndexError"),
}


@pytest.mark.parametrize("case", list(WRONG))
def test_wrong_answers_fail_with_a_reason(case: str) -> None:
    wrong, match = WRONG[case]
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)
