"""Tests for labkit/exercises/nb17.py: the reference causal attention passes, wrong ones fail."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import labkit as lk
from labkit.exercises import ExerciseFailed

NAME = "17_causal_attention"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.checker(ex.reference) == {"shapes": [[1, 1, 1, 4], [2, 3, 5, 8], [3, 2, 16, 4]]}


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(q, k, v):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _masked(q, k, v, diagonal: int, scale: bool = True, lower: bool = False):
    T, d = q.shape[-2], q.shape[-1]
    s = q @ k.transpose(-2, -1) / (math.sqrt(d) if scale else 1.0)
    ones = torch.ones(T, T, dtype=torch.bool)
    mask = ones.tril(-1) if lower else ones.triu(diagonal)
    return torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ v


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), "every key"),
        (lambda q, k, v: _masked(q, k, v, 1, scale=False), "√d"),
        (lambda q, k, v: _masked(q, k, v, 0), "NaN"),
        (lambda q, k, v: _masked(q, k, v, 2), "output differs"),
        (lambda q, k, v: _masked(q, k, v, 1, lower=True), "output differs"),
        (lambda q, k, v: _masked(q, k, v, 1).detach(), "no gradient"),
        (lambda q, k, v: _masked(q, k, v, 1)[:, :, :-1], "same shape"),
    ],
    ids=["no-mask", "no-scale", "diagonal-masked", "sees-next", "anti-causal", "detached", "shape"],
)
def test_wrong_answers_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)
