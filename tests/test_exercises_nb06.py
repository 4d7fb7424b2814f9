"""Tests for labkit/exercises/nb06.py: the reference passes, wrong answers fail with a reason."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import labkit as lk
from labkit.exercises import ExerciseFailed, nb06

NAME = "06_average_gradients"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb06.average_gradients
    assert ex.checker(ex.reference) == {
        "world_sizes": [2, 3],
        "groups": [[0, 2], [1, 3]],
        "parameters": 4,
    }


def test_summing_without_dividing_fails() -> None:
    def summed(model, group=None) -> None:
        for p in model.parameters():
            dist.all_reduce(p.grad, group=group)

    with pytest.raises(ExerciseFailed, match="divide by the world size"):
        lk.exercises.get(NAME).checker(summed)


def test_not_communicating_fails() -> None:
    def local_only(model, group=None) -> None:
        pass

    with pytest.raises(ExerciseFailed, match="all-reduce it across the ranks"):
        lk.exercises.get(NAME).checker(local_only)


def test_ignoring_the_group_fails() -> None:
    def world_average(model, group=None) -> None:  # right on the world, wrong on a subgroup
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()

    with pytest.raises(ExerciseFailed, match=r"average over all 4 ranks, not over .* group"):
        lk.exercises.get(NAME).checker(world_average)


def test_dividing_by_the_world_size_in_a_group_fails() -> None:
    def world_divisor(model, group=None) -> None:
        for p in model.parameters():
            dist.all_reduce(p.grad, group=group)
            p.grad /= dist.get_world_size()  # the world's size, not the group's

    with pytest.raises(ExerciseFailed, match=r"divided by the world's size 4"):
        lk.exercises.get(NAME).checker(world_divisor)


def test_a_crash_names_the_rank() -> None:
    def crash(model, group=None) -> None:
        raise ValueError("boom")

    with pytest.raises(ExerciseFailed, match="rank 0 raised ValueError"):
        lk.exercises.get(NAME).checker(crash)


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(model, group=None) -> None:
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out
