"""Tests for labkit/exercises/nb11.py: the derived slots pass, plausible wrong ones fail."""

from __future__ import annotations

import pytest

import labkit as lk
from labkit.exercises import ExerciseFailed, nb11
from labkit.parallel.pipeline import Action, gpipe, one_f_one_b, zb_h1, zb_h1_orders

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


# ------------------------------------------------------------------------------ 11_zb_h1

ZB = "11_zb_h1"


def test_zb_h1_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(ZB)
    assert ex.reference is zb_h1_orders
    assert ex.checker(ex.reference) == {"cases": [list(c) for c in nb11.ZB_CASES]}
    assert any(m < p for p, m in nb11.ZB_CASES) and any(m > p for p, m in nb11.ZB_CASES)


def test_zb_h1_prompt_gives_no_formula() -> None:
    prompt = lk.exercises.get(ZB).prompt
    assert "k >= r" not in prompt and "r + 1" not in prompt and "delays" not in prompt


def test_zb_h1_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(n_stages, n_microbatches):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(ZB, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _one_f_one_b_orders(p: int, m: int) -> list[list[Action]]:
    return [[a for a in row if a is not None] for row in one_f_one_b(p, m)]


def _w_right_after_b(p, m):  # split backward, but W at once: 1F1B with a longer backward
    return [[x for a in row for x in ((a, Action(a.stage, "W", a.microbatch)) if a.op == "B"
                                      else (a,))] for row in _one_f_one_b_orders(p, m)]  # fmt: skip


def _all_w_at_end(p, m):  # no bubble left at the end, but every activation held to the end
    return [row + [Action(r, "W", i) for i in range(m)]
            for r, row in enumerate(_one_f_one_b_orders(p, m))]  # fmt: skip


def _w_before_b(p, m):  # each W just before its B
    return [[x for a in row for x in ((Action(a.stage, "W", a.microbatch), a) if a.op == "B"
                                      else (a,))] for row in _one_f_one_b_orders(p, m)]  # fmt: skip


def _missing_last_w(p, m):  # forgets the W of the last micro-batch
    return [[a for a in row if a != Action(r, "W", m - 1)]
            for r, row in enumerate(zb_h1_orders(p, m))]  # fmt: skip


def _delay_one_more(p, m):  # rank r waits for r + 2 backwards before its first W
    out = []
    for r, row in enumerate(_one_f_one_b_orders(p, m)):
        order, n_b, n_w = [], 0, 0
        for a in row:
            order.append(a)
            if a.op == "B":
                n_b += 1
                if n_b >= r + 2:
                    order.append(Action(r, "W", n_w))
                    n_w += 1
        out.append(order + [Action(r, "W", i) for i in range(n_w, m)])
    return out


def _placed_rows(p, m):  # hands back the placed schedule, waits (None) included
    return zb_h1(p, m)


ZB_WRONG = {
    "w-right-after-b": (
        _w_right_after_b,
        r"with 2 stages and 4 micro-batches your step takes "
        r"14 slots, ZB-H1 takes 2m \+ p − 1 \+ max\(m, p\) = 13",
    ),
    "all-w-at-end": (
        _all_w_at_end,
        r"stage 0 holds 4 micro-batches' activations .* at most "
        r"min\(p, m\) = 2",
    ),
    "w-before-its-b": (_w_before_b, r"rank 0 runs 0W0 before 0B0"),
    "missing-w": (_missing_last_w, r"rank 0 has no W for micro-batch\(es\) \[3\]: ZB-H1 splits"),
    "no-w-at-all": (_one_f_one_b_orders, r"rank 0 has no W for micro-batch\(es\) \[0, 1, 2, 3\]"),
    "delayed-one-more": (_delay_one_more, r"holds 3 micro-batches' activations"),
    "placed-schedule": (_placed_rows, r"holds None: list only pp.Action"),
    "one-list": (lambda p, m: zb_h1_orders(p, m)[0], r"give one list of actions per rank"),
    "raises": (lambda p, m: [][0], r"raised IndexError"),
}


@pytest.mark.parametrize("case", list(ZB_WRONG))
def test_zb_h1_wrong_answers_fail_with_a_reason(case: str) -> None:
    wrong, match = ZB_WRONG[case]
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(ZB, wrong)
