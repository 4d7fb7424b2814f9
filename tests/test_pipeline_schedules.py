"""Tests for labkit/parallel/pipeline/{schedules,validate,metrics}.py: no processes."""

from __future__ import annotations

import pytest

from labkit.parallel.pipeline import (
    Action,
    ScheduleError,
    bubble_fraction,
    bubble_fraction_theory,
    format_schedule,
    gpipe,
    interleaved_one_f_one_b,
    messages_in_order,
    one_f_one_b,
    peak_in_flight,
    peak_in_flight_theory,
    place,
    validate,
)

PM = [(1, 1), (1, 3), (2, 1), (2, 4), (3, 5), (4, 2), (4, 4), (4, 8), (5, 7)]
PMV = [(2, 2, 2), (2, 4, 2), (2, 4, 3), (4, 4, 2), (4, 8, 2), (3, 6, 4), (4, 8, 1)]


def test_action_prints_as_stage_op_microbatch() -> None:
    assert str(Action(2, "F", 0)) == "2F0"
    assert str(Action(11, "B", 3)) == "11B3"
    with pytest.raises(AttributeError):
        Action(0, "F", 0).stage = 1  # type: ignore[misc]


@pytest.mark.parametrize(("p", "m"), PM)
@pytest.mark.parametrize("make", [gpipe, one_f_one_b], ids=["gpipe", "1f1b"])
def test_gpipe_and_1f1b_are_valid_with_the_closed_form_bubble(make, p, m) -> None:
    s = make(p, m)
    where = validate(s, p, m)
    assert len(where) == 2 * p * m
    assert all(len(row) == 2 * (m + p - 1) for row in s)
    assert bubble_fraction(s) == pytest.approx(bubble_fraction_theory(p, m), abs=1e-12)
    assert bubble_fraction(s) == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


@pytest.mark.parametrize(("p", "m", "v"), PMV)
def test_interleaved_is_valid_and_its_bubble_shrinks_by_v(p, m, v) -> None:
    s = interleaved_one_f_one_b(p, m, v)
    validate(s, p * v, m)
    assert all(len(row) == 2 * (v * m + p - 1) for row in s)
    assert bubble_fraction(s) == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)
    assert bubble_fraction(s) == pytest.approx(bubble_fraction_theory(p, m, v), abs=1e-12)
    # rank r holds stages r, r + p, ...
    for r, row in enumerate(s):
        assert {a.stage for a in row if a is not None} == {r + k * p for k in range(v)}
    # bubble time per unit of work: (p − 1)/(v m) — v times the non-interleaved one's
    if v > 1:
        idle_per_work = bubble_fraction(s) / (1 - bubble_fraction(s))
        assert idle_per_work * v == pytest.approx((p - 1) / m)


def test_interleaved_needs_m_multiple_of_p() -> None:
    with pytest.raises(ValueError, match="multiple"):
        interleaved_one_f_one_b(4, 6, 2)
    with pytest.raises(ValueError):
        gpipe(0, 3)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 4), (4, 8), (3, 7)])
def test_in_flight_gpipe_holds_m_and_1f1b_at_most_p(p, m) -> None:
    g, f = peak_in_flight(gpipe(p, m)), peak_in_flight(one_f_one_b(p, m))
    assert g == {s: m for s in range(p)}
    assert all(f[s] <= p for s in range(p))
    for s in range(p):
        assert g[s] == peak_in_flight_theory("gpipe", s, p, m)
        assert f[s] == peak_in_flight_theory("1f1b", s, p, m)
    assert f[0] == min(p, m)


def test_generated_schedules_receive_messages_in_send_order() -> None:
    for p in (2, 3, 4):
        for m in (p, 2 * p):
            assert messages_in_order(gpipe(p, m), p)
            assert messages_in_order(one_f_one_b(p, m), p)
            for v in (2, 3):
                assert messages_in_order(interleaved_one_f_one_b(p, m, v), p * v)
    # rank 1 takes micro-batch 1 before 0: valid, but its receives are out of send order
    orders = [
        [Action(0, "F", 0), Action(0, "F", 1), Action(0, "B", 0), Action(0, "B", 1)],
        [Action(1, "F", 1), Action(1, "F", 0), Action(1, "B", 0), Action(1, "B", 1)],
    ]
    s = place(orders, 2)
    validate(s, 2, 2)
    assert not messages_in_order(s, 2)


def test_text_grid() -> None:
    assert format_schedule(gpipe(2, 2)) == (
        "rank 0 | 0F0 0F1 .   .   0B0 0B1\nrank 1 | .   1F0 1F1 1B0 1B1 ."
    )


# ---------------------------------------------------------------- schedules the validator rejects


def _swap(s, r, t1, t2):
    s = [list(row) for row in s]
    s[r][t1], s[r][t2] = s[r][t2], s[r][t1]
    return s


def _slot_of(s, action):
    for r, row in enumerate(s):
        for t, a in enumerate(row):
            if a == action:
                return r, t
    raise AssertionError(action)


def test_rejects_backward_before_forward() -> None:
    s = one_f_one_b(2, 2)
    r, tf = _slot_of(s, Action(1, "F", 0))
    _, tb = _slot_of(s, Action(1, "B", 0))
    bad = _swap(s, r, tf, tb)
    with pytest.raises(ScheduleError, match="forward-before-backward") as err:
        validate(bad, 2, 2)
    assert (err.value.rule, err.value.rank, err.value.slot) == ("forward-before-backward", 1, tf)
    assert "1B0" in str(err.value) and f"slot {tf}" in str(err.value)


def test_rejects_stage_order_forward() -> None:
    s = [list(row) for row in gpipe(2, 1)]  # rank 1 runs 1F0 in slot 1; move it to slot 0
    s[1][0], s[1][1] = s[1][1], None
    with pytest.raises(ScheduleError, match=r"\[stage-order\] rank 1, slot 0: 1F0 needs .*0F0"):
        validate(s, 2, 1)


def test_rejects_stage_order_backward() -> None:
    s = [list(row) for row in gpipe(2, 1)]  # 0B0 in the same slot as 1B0: no gradient yet
    _, t = _slot_of(s, Action(1, "B", 0))
    _, t0 = _slot_of(s, Action(0, "B", 0))
    s[0][t], s[0][t0] = s[0][t0], None
    with pytest.raises(ScheduleError, match=r"stage-order.*0B0 needs the gradient from 1B0"):
        validate(s, 2, 1)


def test_rejects_duplicate_and_missing_actions() -> None:
    s = [list(row) for row in gpipe(2, 2)]
    s[0][2] = Action(0, "F", 1)  # an idle slot now repeats 0F1
    with pytest.raises(ScheduleError, match=r"exactly-once.*0F1 appears twice"):
        validate(s, 2, 2)
    s = [list(row) for row in gpipe(2, 2)]
    s[0][5] = None  # drop 0B1
    with pytest.raises(ScheduleError, match=r"exactly-once.*0B1 is missing"):
        validate(s, 2, 2)


def test_rejects_two_actions_in_one_slot() -> None:
    s = [list(row) for row in gpipe(2, 2)]
    s[0][2] = (Action(0, "B", 0), Action(0, "B", 1))
    with pytest.raises(ScheduleError, match=r"one-per-slot.*rank 0, slot 2: 2 actions") as err:
        validate(s, 2, 2)
    assert err.value.slot == 2


def test_rejects_a_stage_on_the_wrong_rank() -> None:
    s = [list(row) for row in gpipe(2, 1)]
    s[0], s[1] = s[1], s[0]
    with pytest.raises(ScheduleError, match=r"placement.*lives on rank 1"):
        validate(s, 2, 1)
    # interleaved: stage 2 belongs to rank 0 of 2, not rank 1
    s = interleaved_one_f_one_b(2, 2, 2)
    with pytest.raises(ScheduleError, match="placement"):
        validate([s[0], [Action(2, "F", 0) if a == Action(3, "F", 0) else a for a in s[1]]], 4, 2)


def test_rejects_unknown_ops_and_out_of_range() -> None:
    s = [list(row) for row in gpipe(2, 1)]
    s[0][1] = Action(0, "X", 0)  # type: ignore[arg-type]  (W is known: zero bubble)
    with pytest.raises(ScheduleError, match="known-action"):
        validate(s, 2, 1)
    s[0][1] = Action(0, "F", 5)
    with pytest.raises(ScheduleError, match="out of range"):
        validate(s, 2, 1)
    s[0][1] = "0F0"
    with pytest.raises(ScheduleError, match="neither an Action nor None"):
        validate(s, 2, 1)
    with pytest.raises(ValueError, match="multiple"):
        validate(gpipe(2, 1), 3, 1)


def test_place_reports_a_deadlock() -> None:
    orders = [[Action(0, "B", 0), Action(0, "F", 0)], [Action(1, "F", 0), Action(1, "B", 0)]]
    with pytest.raises(ValueError, match="deadlock"):
        place(orders, 2)
