"""Tests for labkit/exercises/_failures.py: how a checker's launch of a learner's code fails."""

from __future__ import annotations

import time

import pytest

from labkit.exercises import ExerciseFailed
from labkit.exercises._failures import DEADLOCK, launch_learner
from labkit.launcher import RankError


def _hangs_on_rank_1(rank, world_size):
    if rank == 1:
        time.sleep(60)
    return rank


def _raises_on_rank_0(rank, world_size):
    if rank == 0:
        raise ValueError("bad shape")
    return rank


def _todo(rank, world_size):
    raise NotImplementedError("your code here")


def _todo_on_rank_0(rank, world_size):
    if rank == 0:
        raise NotImplementedError("your code here")
    raise ValueError("rank 0 never answered")


def _run(rank, world_size, fn):
    return fn(rank, world_size)


def _launch(fn, timeout_s=60.0, **options):
    return launch_learner(
        _run,
        2,
        backend="gloo",
        args=(fn,),
        timeout_s=timeout_s,
        hang="Call it on every rank.",
        **options,
    )


def test_results_come_back_in_rank_order() -> None:
    assert _launch(lambda rank, world_size: rank * 10) == [0, 10]


def test_a_hang_fails_with_the_hint_and_where_ranks_were() -> None:
    with pytest.raises(ExerciseFailed) as info:
        _launch(_hangs_on_rank_1, timeout_s=3.0)
    msg = str(info.value)
    assert msg.startswith("on 2 ranks the function did not finish within 3 s. Call it on every")
    assert "rank(s) 1 had not finished" in msg  # the launcher's headline names the rank


def test_a_raising_rank_is_named() -> None:
    with pytest.raises(ExerciseFailed, match="on 2 ranks, rank 0 raised ValueError: bad shape"):
        _launch(_raises_on_rank_0)


def test_not_attempted_is_passed_on_for_the_reference() -> None:
    with pytest.raises(RankError) as info:
        _launch(_todo)
    assert not isinstance(info.value, ExerciseFailed)


def test_a_deadlock_message_can_show_every_rank_stack() -> None:
    with pytest.raises(ExerciseFailed) as info:
        _launch(_hangs_on_rank_1, timeout_s=3.0, did_not_finish=DEADLOCK, stacks=True)
    msg = str(info.value)
    assert msg.startswith("deadlock on 2 ranks: no rank finished within 3 s. Call it on every")
    assert "--- rank 1 (stuck) ---" in msg  # the launcher's whole report, not its headline


def test_the_rank_error_message_and_hint_are_the_callers() -> None:
    with pytest.raises(ExerciseFailed) as info:
        _launch(_raises_on_rank_0, failed="{cause}.", hint=lambda cause: f" [{cause[-5:]}]")
    assert str(info.value) == "rank 0 raised ValueError: bad shape. [shape]"


def test_todo_on_one_rank_counts_when_only_some_ranks_run_the_learner() -> None:
    with pytest.raises(ExerciseFailed, match="rank 0 raised NotImplementedError"):
        _launch(_todo_on_rank_0)  # by default every failing rank must raise it
    with pytest.raises(NotImplementedError):
        _launch(_todo_on_rank_0, todo_on_any_rank=True)
