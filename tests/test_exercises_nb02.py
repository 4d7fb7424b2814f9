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


def test_another_algorithm_from_broadcasts_passes() -> None:
    # Every rank broadcasts its tensor in turn and all add them up: p broadcasts, no reduce.
    def by_broadcasts(tensor: torch.Tensor, group=None) -> None:
        total = torch.zeros_like(tensor)
        for root in range(dist.get_world_size(group)):
            part = tensor.clone()
            dist.broadcast(part, group=group, group_src=root)
            total += part
        tensor.copy_(total)

    assert lk.exercises.check(NAME, by_broadcasts).status == "passed"


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


def _all_gather_and_sum(tensor, group=None):
    # The right numbers, but from an all_gather: not what the exercise builds.
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor, group=group)
    tensor.copy_(torch.stack(parts).sum(0))


def _reduce_scatter_and_all_gather(tensor, group=None):
    # all_reduce = reduce_scatter + all_gather: correct, but neither collective is allowed here.
    p = dist.get_world_size(group)
    flat = tensor.reshape(-1)
    buf = torch.cat([flat, flat.new_zeros((-flat.numel()) % p)])
    part = buf.new_empty(buf.numel() // p)
    dist.reduce_scatter_single(part, buf, group=group)
    dist.all_gather_single(buf, part, group=group)
    tensor.copy_(buf[: flat.numel()].reshape(tensor.shape))


def _reduce_then_all_gather(tensor, group=None):
    dist.reduce(tensor, group=group, group_dst=0)
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor, group=group)  # broadcast's job, done by another collective
    tensor.copy_(parts[0])


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
        (_all_gather_and_sum, "rank 0 ran all_gather (the backend recorded: all_gather)"),
        (
            _reduce_scatter_and_all_gather,
            "rank 0 ran reduce_scatter_tensor, all_gather_into_tensor",
        ),
        (_reduce_then_all_gather, "(the backend recorded: reduce, all_gather)"),
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
