"""Tests for labkit/exercises/nb12.py: the reference f passes, wrong f operators fail."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.exercises import ExerciseFailed

NAME = "12_f_operator"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.checker(ex.reference) == {"world_sizes": [2, 4]}


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(x, group=None):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


class _NoReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad  # forgets the all-reduce: only this rank's part of ∂L/∂x


class _Average(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, op=dist.ReduceOp.AVG)
        return grad


def _reduce_forward(x, group=None):
    """g instead of f: all-reduce in forward."""
    return lk.parallel.tensor.reduce_from_parallel(x, group)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda x, group=None: _NoReduce.apply(x), "only this rank's part"),
        (lambda x, group=None: _Average.apply(x), "SUM all-reduce, not an average"),
        (_reduce_forward, "unchanged in forward"),
        (lambda x, group=None: x.detach(), "x got no gradient"),
    ],
    ids=["no-all-reduce", "average", "g-not-f", "detached"],
)
def test_wrong_answers_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)
