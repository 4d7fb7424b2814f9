"""Tests for labkit/exercises/nb13.py: the reference passes, wrong ZeRO-1 updates fail."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import labkit as lk
from labkit.exercises import ExerciseFailed, nb13

NAME = "13_zero1_update"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb13.zero1_update
    assert ex.checker(ex.reference) == {"world_sizes": [2, 3], "numel": nb13.N}


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(flat_params, flat_grads, step_shard, group=None):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _no_average(flat_params, flat_grads, step_shard, group=None):
    ws, r = dist.get_world_size(group), dist.get_rank(group)
    dist.all_reduce(flat_grads, group=group)
    s = flat_params.numel() // ws
    step_shard(flat_params[r * s : (r + 1) * s], flat_grads[r * s : (r + 1) * s])
    dist.all_gather_into_tensor(flat_params, flat_params[r * s : (r + 1) * s].clone())


def _no_gather(flat_params, flat_grads, step_shard, group=None):
    ws, r = dist.get_world_size(group), dist.get_rank(group)
    dist.all_reduce(flat_grads, group=group)
    flat_grads /= ws
    s = flat_params.numel() // ws
    step_shard(flat_params[r * s : (r + 1) * s], flat_grads[r * s : (r + 1) * s])


def _step_everything(flat_params, flat_grads, step_shard, group=None):
    dist.all_reduce(flat_grads, group=group)
    flat_grads /= dist.get_world_size(group)
    step_shard(flat_params, flat_grads)  # plain data parallelism: every rank keeps all states


def _own_gradient(flat_params, flat_grads, step_shard, group=None):
    ws, r = dist.get_world_size(group), dist.get_rank(group)
    s = flat_params.numel() // ws
    step_shard(flat_params[r * s : (r + 1) * s], flat_grads[r * s : (r + 1) * s])
    dist.all_gather_into_tensor(flat_params, flat_params[r * s : (r + 1) * s].clone())


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (_no_average, "N_d× too large"),
        (_no_gather, "all-gather the shards"),
        (_step_everything, r"called step_shard with \[12\] elements"),
        (_own_gradient, "average the gradients first"),
    ],
    ids=["no-average", "no-gather", "whole-buffer", "own-gradient"],
)
def test_wrong_answers_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)
