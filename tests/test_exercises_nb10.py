"""Tests for labkit/exercises/nb10.py: the reference backward passes, wrong ones fail, none hang."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.exercises import ExerciseFailed

NAME = "10_stage_backward"
WAIT = timedelta(seconds=30)


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.checker(ex.reference) == {"world_sizes": [3, 4]}


def test_plain_send_and_recv_pass(capsys) -> None:
    def blocking(inp, out, group=None):
        r = dist.get_rank(group)
        grad = torch.empty_like(out)
        dist.recv(grad, group=group, group_src=r + 1)
        out.backward(grad)
        dist.send(inp.grad, group=group, group_dst=r - 1)

    assert lk.exercises.check(NAME, blocking).status == "passed"
    assert "correct" in capsys.readouterr().out


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(inp, out, group=None):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _recv(out, group):
    grad = torch.empty_like(out)
    dist.irecv(grad, group=group, group_src=dist.get_rank(group) + 1).wait(WAIT)
    return grad


def _send(t, group, dst):
    dist.isend(t.contiguous(), group=group, group_dst=dst).wait(WAIT)


def _forwards_the_gradient(inp, out, group=None):
    """Passes the received gradient on without a backward: no parameter gradients."""
    _send(_recv(out, group), group, dist.get_rank(group) - 1)


def _ones_instead_of_received(inp, out, group=None):
    """Starts backward from ones, as if it were the loss."""
    _recv(out, group)
    torch.autograd.backward(out, torch.ones_like(out))
    _send(inp.grad, group, dist.get_rank(group) - 1)


def _sends_zeros(inp, out, group=None):
    torch.autograd.backward(out, _recv(out, group))
    _send(torch.zeros_like(inp), group, dist.get_rank(group) - 1)


def _never_sends(inp, out, group=None):
    torch.autograd.backward(out, _recv(out, group))


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (_forwards_the_gradient, "got no gradient"),
        (_ones_instead_of_received, "must start from the gradient received"),
        (_sends_zeros, r"stage 0 received a wrong gradient from stage 1: send inp.grad"),
        (_never_sends, "never came: send inp.grad to rank r − 1"),
        (lambda inp, out, group=None: 1 / 0, "ZeroDivisionError"),
    ],
    ids=["no-backward", "ones", "zeros-sent", "never-sends", "raises"],
)
def test_wrong_answers_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)
