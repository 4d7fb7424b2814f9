"""Tests for labkit/exercises/nb02.py: the reference passes, wrong answers fail with a reason."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.exercises import ExerciseFailed, nb02

NAME = "02_allreduce_from_parts"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb02.allreduce_from_parts
    detail = ex.checker(ex.reference)
    assert detail == {"world_sizes": [2, 3], "cases": 3}


def test_another_correct_algorithm_passes() -> None:
    # all_reduce = reduce_scatter + all_gather: not the suggested route, still correct
    def via_reduce_scatter(tensor: torch.Tensor, group=None) -> None:
        p = dist.get_world_size(group)
        flat = tensor.reshape(-1)
        buf = torch.cat([flat, flat.new_zeros((-flat.numel()) % p)])
        part = buf.new_empty(buf.numel() // p)
        dist.reduce_scatter_single(part, buf, group=group)
        dist.all_gather_single(buf, part, group=group)
        tensor.copy_(buf[: flat.numel()].reshape(tensor.shape))

    assert lk.exercises.check(NAME, via_reduce_scatter).status == "passed"


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(tensor, group=None):
        raise NotImplementedError("your code here")

    result = lk.exercises.check(NAME, todo)
    assert result.status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _reduce_only(tensor, group=None):
    dist.reduce(tensor, group=group, group_dst=0)


def _global_root(tensor, group=None):
    dist.reduce(tensor, dst=0, group=group)
    dist.broadcast(tensor, src=0, group=group)


def _calls_all_reduce(tensor, group=None):
    dist.all_reduce(tensor, group=group)


def _returns_instead(tensor, group=None):
    out = tensor.clone()
    dist.reduce(out, group=group, group_dst=0)
    dist.broadcast(out, group=group, group_src=0)
    return out


def _broadcast_only(tensor, group=None):
    dist.broadcast(tensor, group=group, group_src=0)


def _does_nothing(tensor, group=None):
    return None


def _off_by_one(tensor, group=None):
    dist.reduce(tensor, group=group, group_dst=0)
    dist.broadcast(tensor, group=group, group_src=0)
    tensor[0, 0] += 1


def _raises(tensor, group=None):
    raise ValueError("oops")


@pytest.mark.parametrize(
    ("wrong", "reason"),
    [
        (_reduce_only, "Only the root holds the sum"),
        (_global_root, "group_dst=0"),
        (_calls_all_reduce, "switched off"),
        (_returns_instead, "left `tensor` unchanged"),
        (_broadcast_only, "reduce to the root before broadcasting"),
        (_does_nothing, "works in place"),
        (_off_by_one, "first at index (0, 0)"),
        (_raises, "raised ValueError: oops"),
    ],
)
def test_wrong_answers_fail_with_a_reason(wrong, reason: str, capsys) -> None:
    with pytest.raises(ExerciseFailed) as info:
        lk.exercises.check(NAME, wrong)
    assert reason in str(info.value)
    assert "✗" in capsys.readouterr().out


def test_a_hang_is_reported_as_a_failure(monkeypatch) -> None:
    monkeypatch.setattr(nb02, "TIMEOUT_S", 3.0)

    def hangs(tensor, group=None):
        time.sleep(60)

    with pytest.raises(ExerciseFailed, match="did not finish within 3 s"):
        nb02.check_allreduce_from_parts(hangs)


def test_all_reduce_is_restored_after_the_forbidden_block() -> None:
    original = dist.all_reduce
    with nb02._forbid(("all_reduce",)):
        with pytest.raises(ExerciseFailed):
            dist.all_reduce(torch.zeros(1))
    assert dist.all_reduce is original
