"""Tests for labkit/exercises/nb08.py: the references pass, wrong answers fail with a reason."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import labkit as lk
from labkit.exercises import ExerciseFailed, nb08
from labkit.parallel import async_sgd as A


@pytest.mark.slow  # five launches
def test_references_pass_their_checkers() -> None:
    apply_ex = lk.exercises.get("08_apply_gradient")
    assert apply_ex.reference is A.apply_gradient
    detail = apply_ex.checker(apply_ex.reference)
    assert detail["updates"] == nb08.UPDATES
    assert sum(detail["staleness_3_ranks"]) / nb08.UPDATES == pytest.approx(
        A.predicted_mean_staleness(nb08.UPDATES, 2)
    )
    avg_ex = lk.exercises.get("08_average_parameters")
    assert avg_ex.reference is A.average_parameters
    assert avg_ex.checker(avg_ex.reference) == {
        "world_size": 3,
        "mean": [1.0, 3.0, 5.0, 7.0],
        "groups": [[0, 2], [1, 3]],
    }


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(theta, version, grad, grad_version, lr):
        raise NotImplementedError("your code here")

    assert lk.exercises.check("08_apply_gradient", todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _stale_after_counting(theta, version, grad, grad_version, lr):
    version += 1
    theta.add_(grad, alpha=-lr)
    return version, version - grad_version  # counts its own update: 1 with one worker


def _not_in_place(theta, version, grad, grad_version, lr):
    theta = theta - lr * grad  # a new tensor: the server's parameters never change
    return version + 1, version - grad_version


def _ascent(theta, version, grad, grad_version, lr):
    theta.add_(grad, alpha=lr)
    return version + 1, version - grad_version


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        (_stale_after_counting, "3 updates stale"),
        (_not_in_place, "in place"),
        (_ascent, "θ − lr·g"),
    ],
)
def test_wrong_server_steps_fail(wrong, says) -> None:
    with pytest.raises(ExerciseFailed, match=says):
        lk.exercises.check("08_apply_gradient", wrong)


def test_a_step_right_by_hand_but_wrong_in_the_server_fails() -> None:
    def version_from_the_gradient(theta, version, grad, grad_version, lr):
        theta.add_(grad, alpha=-lr)
        if version == 7 and grad_version == 4:  # passes the by-hand numbers only
            return 8, 3
        return grad_version + 1, 0  # forgets the server's own version

    with pytest.raises(ExerciseFailed, match="versions must count"):
        lk.exercises.check("08_apply_gradient", version_from_the_gradient)


def _sum_only(theta, group=None):
    dist.all_reduce(theta, group=group)


def _local_mean_only(theta, group=None):
    theta.div_(1.0)  # no communication: every rank keeps its own


@pytest.mark.parametrize("wrong", [_sum_only, _local_mean_only])
def test_wrong_averages_fail(wrong) -> None:
    with pytest.raises(ExerciseFailed, match="mean"):
        lk.exercises.check("08_average_parameters", wrong)


def _world_mean(theta, group=None):  # right with the default group, wrong on a subgroup
    dist.all_reduce(theta)
    theta.div_(dist.get_world_size())


def test_ignoring_the_group_fails() -> None:
    with pytest.raises(ExerciseFailed, match=r"mean over all 4 ranks, not over the group"):
        lk.exercises.check("08_average_parameters", _world_mean)
