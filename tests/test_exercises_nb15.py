"""Tests for labkit/exercises/nb15.py: the reference passes, wrong g / ḡ / reductions fail.

Each wrong answer is one mistake a learner might make in sequence parallelism's operators
(Korthikanti et al. 2022, §4.2.2); the checker runs it on 2 ranks over the recording backend.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.exercises import ExerciseFailed, nb15

NAME = "15_sp_operators"


def _gather(x: torch.Tensor, dim: int = 1, reverse: bool = False) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts[::-1] if reverse else parts, dim=dim)


def _scatter(x: torch.Tensor, dim: int = 1, all_reduce: bool = False) -> torch.Tensor:
    p, r = dist.get_world_size(), dist.get_rank()
    if all_reduce:  # right numbers, the whole sequence's bytes: an all-reduce, then a split
        x = x.clone()
        dist.all_reduce(x)
        return x.chunk(p, dim=dim)[r].contiguous()
    parts = [c.contiguous() for c in x.chunk(p, dim=dim)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts)
    return out


def _g(mistake: str = ""):
    """A ``g`` with one mistake: ``batch``, ``order``, ``split`` or ``all_reduce`` backward."""
    dim = 0 if mistake == "batch" else 1

    class G(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return _gather(x, dim, reverse=mistake == "order")

        @staticmethod
        def backward(ctx, grad):
            if mistake == "split":  # this rank's tokens of its own gradient: no reduction
                return grad.chunk(dist.get_world_size(), dim=1)[dist.get_rank()].contiguous()
            return _scatter(grad, dim, all_reduce=mistake == "all_reduce")

    return lambda x, group=None: G.apply(x)


def _gbar(mistake: str = ""):
    """A ``ḡ`` with one mistake: ``all_reduce`` in forward."""

    class GBar(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return _scatter(x, all_reduce=mistake == "all_reduce")

        @staticmethod
        def backward(ctx, grad):
            return _gather(grad)

    return lambda x, group=None: GBar.apply(x)


def _no_reduction(grads, group=None) -> None:
    """The LayerNorms' gradients left as this rank's partial sums."""


def _average(grads, group=None) -> None:
    for g in grads:
        dist.all_reduce(g)
        g /= dist.get_world_size()


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb15.REFERENCE
    got = ex.checker(ex.reference)
    assert got["world_size"] == 2
    assert got["ops"] == ["all_gather_into_tensor", "reduce_scatter_tensor"] * 4  # fwd, bwd
    # the answers below, written correctly, pass too: the mistakes alone make them fail
    assert ex.checker((_g(), _gbar(), nb15.reference_reduce_grads))["world_size"] == 2


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(x, group=None):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, (todo, todo, todo)).status == "reference"
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        ((_g("all_reduce"), _gbar(), nb15.reference_reduce_grads), "twice the bytes"),
        ((_g("split"), _gbar(), nb15.reference_reduce_grads), r"only this rank's part"),
        ((_g("batch"), _gbar(), nb15.reference_reduce_grads), r"gathered along the batch"),
        ((_g("order"), _gbar(), nb15.reference_reduce_grads), "wrong order"),
        ((_g(), _gbar("all_reduce"), nb15.reference_reduce_grads), "twice the bytes"),
        ((_g(), _gbar(), _no_reduction), "partial sum"),
        ((_g(), _gbar(), _average), "average"),
        ((_g(), _gbar(), lambda grads, group=None: 1 / 0), "raised ZeroDivisionError"),
    ],
    ids=[
        "g-backward-all-reduce-then-split",
        "g-backward-split",
        "gather-on-batch-dim",
        "wrong-rank-order",
        "gbar-forward-all-reduce-then-split",
        "layernorm-grads-not-reduced",
        "layernorm-grads-averaged",
        "reduce-raises",
    ],
)
def test_wrong_answers_fail_with_a_reason(answer, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, answer)


def test_not_a_tuple_of_three() -> None:
    with pytest.raises(ExerciseFailed, match="tuple of three"):
        lk.exercises.check(NAME, nb15.reference_g)
