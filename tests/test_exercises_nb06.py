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
    assert ex.checker(ex.reference) == {"world_sizes": [2, 3], "parameters": 4}


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
