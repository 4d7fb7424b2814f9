"""Tests for labkit/exercises/nb16.py: the reference merge passes, wrong merges fail.

Each wrong answer is a mistake a learner might make in the online softmax's merge
(Milakov and Gimelshein 2018); the checker folds random key blocks in random orders against
float64 softmax, with ordinary scores and with scores in the hundreds.
"""

from __future__ import annotations

import pytest
import torch

import labkit as lk
from labkit.exercises import ExerciseFailed, nb16

NAME = "16_online_softmax"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb16.reference_merge
    got = ex.checker(ex.reference)
    assert got["folds"] == len(nb16.SCALES) * nb16.N_ORDERS
    assert got["largest_lse"] > 89  # exp of it overflows float32: the large scores bite


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(out1, lse1, out2, lse2):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _naive_exp(o1, l1, o2, l2):
    """Right in exact arithmetic; exp(lse) overflows float32 once lse passes 88."""
    e1, e2 = l1.exp(), l2.exp()
    return (e1[..., None] * o1 + e2[..., None] * o2) / (e1 + e2)[..., None], (e1 + e2).log()


def _max_lse(o1, l1, o2, l2):
    """Weights right for two blocks, but the max kept as the log-normaliser."""
    m = torch.maximum(l1, l2)
    e1, e2 = (l1 - m).exp(), (l2 - m).exp()
    return (e1[..., None] * o1 + e2[..., None] * o2) / (e1 + e2)[..., None], m


def _rescale_one(o1, l1, o2, l2):
    """The running output rescaled, the new block's not."""
    lse = torch.logaddexp(l1, l2)
    return (l1 - lse).exp()[..., None] * o1 + o2, lse


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (nb16._average, "averages the outputs"),
        (nb16._sum, "without rescaling"),
        (_naive_exp, "overflows"),
        (_max_lse, "max of the two"),
        (_rescale_one, r"weight each block's output by exp"),
        (lambda o1, l1, o2, l2: o1, "tuple"),
    ],
    ids=[
        "average",
        "no-rescaling",
        "naive-exp-overflow",
        "max-not-logaddexp",
        "rescale-one",
        "not-a-tuple",
    ],  # fmt: skip
)
def test_wrong_answers_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)


def test_the_naive_merge_passes_ordinary_scores() -> None:
    """It is the overflow, not the formula, that the large scores reject."""
    q, k, v = nb16._data(None, 160)
    blocks = nb16._blocks(q, k, v, 170)
    out, lse = nb16._fold(_naive_exp, blocks, list(range(nb16.N_BLOCKS)))
    want_out, want_lse = nb16._want(q, k, v)
    assert nb16._close(out, want_out, nb16.ATOL) and nb16._close(lse, want_lse, nb16.LSE_ATOL)
