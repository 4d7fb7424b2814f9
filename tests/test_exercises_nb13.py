"""Tests for labkit/exercises/nb13.py: the reference passes, wrong ZeRO-1 updates fail.

Each wrong answer pads (or not) and communicates as a learner might; the checker runs it on
2 and 3 ranks with N = 12 (every world size divides it) and N = 13 (none does).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.exercises import ExerciseFailed, nb13

NAME = "13_zero1_update"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb13.zero1_update
    assert ex.checker(ex.reference) == {"world_sizes": [2, 3], "numels": [12, 13]}
    assert all(12 % ws == 0 and 13 % ws for ws in nb13.WORLD_SIZES)


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(flat_params, flat_grads, step_shard, group=None):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _padded(t: torch.Tensor, ws: int, front: bool = False) -> tuple[torch.Tensor, int]:
    s = -(-t.numel() // ws)
    zeros = t.new_zeros(s * ws - t.numel())
    return (torch.cat([zeros, t]) if front else torch.cat([t, zeros])), s


def _update(flat_params, flat_grads, step_shard, *, average=True, gather=True, reduce=True,
            all_reduce=False, front=False, unpad_tail=False):  # fmt: skip
    """A ZeRO-1 update with one mistake switched on."""
    ws, r = dist.get_world_size(), dist.get_rank()
    n = flat_params.numel()
    grads, s = _padded(flat_grads, ws, front)
    params, _ = _padded(flat_params, ws, front)
    if all_reduce:
        dist.all_reduce(grads)
        grad_shard = grads[r * s : (r + 1) * s].clone()
    elif reduce:
        grad_shard = grads.new_empty(s)
        dist.reduce_scatter_tensor(grad_shard, grads)
    else:
        grad_shard = grads[r * s : (r + 1) * s].clone()
    if average and reduce:
        grad_shard /= ws
    shard = params[r * s : (r + 1) * s].clone()
    step_shard(shard, grad_shard)
    if gather:
        dist.all_gather_into_tensor(params, shard)
    else:
        params[r * s : (r + 1) * s] = shard
    pad = s * ws - n
    flat_params.copy_(params[pad:] if (front or unpad_tail) else params[:n])


def _no_average(*args, group=None):
    _update(*args, average=False)


def _no_gather(*args, group=None):
    _update(*args, gather=False)


def _own_gradient(*args, group=None):
    _update(*args, reduce=False)


def _all_reduce(*args, group=None):  # the 3Ψ contrast: right numbers, twice the gradient bytes
    _update(*args, all_reduce=True)


def _pads_at_the_front(*args, group=None):  # right numbers, the remainder in rank 0's shard
    _update(*args, front=True)


def _copies_the_last_n(*args, group=None):  # pads at the end, unpads from the front
    _update(*args, unpad_tail=True)


def _step_everything(flat_params, flat_grads, step_shard, group=None):
    dist.all_reduce(flat_grads)
    flat_grads /= dist.get_world_size()
    step_shard(flat_params, flat_grads)  # plain data parallelism: every rank keeps all states


def _drops_the_remainder(flat_params, flat_grads, step_shard, group=None):
    ws, r = dist.get_world_size(), dist.get_rank()
    s = flat_params.numel() // ws  # floor: the last N mod N_d elements belong to nobody
    grad_shard = flat_grads.new_empty(s)
    dist.reduce_scatter_tensor(grad_shard, flat_grads[: s * ws].contiguous())
    grad_shard /= ws
    shard = flat_params[r * s : (r + 1) * s].clone()
    step_shard(shard, grad_shard)
    out = flat_params.new_empty(s * ws)
    dist.all_gather_into_tensor(out, shard)
    flat_params[: s * ws] = out


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (_no_average, "N_d× too large"),
        (_no_gather, "all-gather the shards"),
        (_step_everything, r"with N = 12, rank 0 called step_shard with \[12\] elements"),
        (_own_gradient, "reduce-scatter the gradients first"),
        (_all_reduce, r"an all-reduce .* 3Ψ\). Reduce-scatter instead"),
        (_drops_the_remainder, r"N = 13, rank 0 called step_shard with \[6\] elements; .* "
                               r"13 is not a multiple of 2: pad to 14 elements"),
        (_pads_at_the_front, r"N = 13, rank 0 stepped the wrong elements: its shard is "
                             r"elements \[0, 7\) of the buffer padded with zeros at the end"),
        (_copies_the_last_n, "shifted by the padding"),
    ],
    ids=["no-average", "no-gather", "whole-buffer", "own-gradient", "all-reduce-3psi",
         "drops-remainder", "pads-at-front", "misplaced-unpad"],
)  # fmt: skip
def test_wrong_answers_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)
