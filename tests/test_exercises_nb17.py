"""Tests for labkit/exercises/nb17.py: the reference passes, wrong EP × DP reductions fail.

Each wrong answer reduces the gradients as a learner might; the checker runs it on 4 ranks
(dp = 4, ep = 2) over the recording backend and compares every gradient with one process.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.exercises import ExerciseFailed, nb17
from labkit.parallel import moe

NAME = "17_ep_gradients"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is moe.reduce_ep_gradients
    got = ex.checker(ex.reference)
    assert got["world_size"] == 4 and got["ep"] == 2
    # the data leave an expert idle on one rank and busy on its expert-dp peer (ranks 2 apart)
    idle = got["idle_experts"]
    assert any(e not in idle[(r + 2) % 4] for r in idle for e in idle[r])


def test_reference_data_drop_tokens_and_starve_an_expert_in_one_ep_group() -> None:
    _, kept = nb17.reference()
    per_group = [[a + b for a, b in zip(kept[0], kept[1], strict=True)],
                 [a + b for a, b in zip(kept[2], kept[3], strict=True)]]  # fmt: skip
    assert any((x == 0) != (y == 0) for x, y in zip(*per_group, strict=True))
    assert sum(map(sum, kept)) < nb17.WORLD_SIZE * nb17.T  # capacity dropped some tokens


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(model, dp, edp):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _reduce(params, group, divide, op=dist.ReduceOp.SUM, skip_none=False):
    """One flat all-reduce of ``params``' gradients over ``group``, then ``/ divide``."""
    if skip_none:
        params = [p for p in params if p.grad is not None]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, op=op, group=group)
    flat /= divide
    for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
        p.grad.copy_(g.view_as(p))


def _split(model):
    experts = moe.expert_parameters(model)
    ids = {id(p) for p in experts}
    return [p for p in model.parameters() if id(p) not in ids], experts


def _avg_over_expert_dp(model, dp, edp):
    dense, experts = _split(model)
    _reduce(dense, dp, dist.get_world_size(dp))
    _reduce(experts, edp, 1, op=dist.ReduceOp.AVG)  # divides by edp's 2 ranks, not by dp's 4


def _experts_over_whole_dp(model, dp, edp):
    dense, experts = _split(model)
    _reduce(dense, dp, dist.get_world_size(dp))
    _reduce(experts, dp, dist.get_world_size(dp))  # adds other experts' gradients


def _dense_not_divided(model, dp, edp):
    dense, experts = _split(model)
    _reduce(dense, dp, 1)
    _reduce(experts, edp, dist.get_world_size(dp))


def _skips_idle_experts(model, dp, edp):
    dense, experts = _split(model)
    _reduce(dense, dp, dist.get_world_size(dp))
    _reduce(experts, edp, dist.get_world_size(dp), skip_none=True)  # "nothing to reduce"


def _no_reduction(model, dp, edp):
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)


@pytest.mark.slow  # one 4-rank launch each
@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (_avg_over_expert_dp, r"moe.experts.0.fc1.weight is 2× too large: averaging over the "
                              r"expert-dp group"),
        (_experts_over_whole_dp, r"mixes in other experts' gradients: .* over the expert-dp"),
        (_dense_not_divided, r"rank 0's gradient of in_proj.weight is 4× too large: summed .* "
                             r"not divided by dp = 4"),
        (_skips_idle_experts, r"on 4 ranks, rank \d .*an expert that got no token on one rank "
                              r"\(its .grad is None\) still takes part"),
        (_no_reduction, r"rank 0's gradient of in_proj.weight is unchanged"),
    ],
)  # fmt: skip
def test_wrong_answers_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)
