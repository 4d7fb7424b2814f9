"""Tests for labkit/exercises/nb21.py: the token-weighted average passes, known mistakes fail."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.exercises import ExerciseFailed, nb21

NAME = "21_token_weighted_average"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb21.token_weighted_average
    detail = ex.checker(ex.reference)
    assert detail["world_sizes"] == [2, 3]
    assert detail["tokens"] == {2: [11, 7], 3: [11, 7, 13]}
    assert detail["plain_average_error"] > 1e-3  # the mistake is visible at this size


def test_a_flat_buffer_answer_passes(capsys) -> None:
    def flat(params, n_tokens, group=None):
        grads = [q.grad for q in params]
        buf = torch.cat([g.flatten() for g in grads] + [torch.ones(1)]) * n_tokens
        dist.all_reduce(buf, group=group)  # the count rides in the last element
        buf = buf[:-1] / buf[-1]
        for g, new in zip(grads, buf.split([g.numel() for g in grads]), strict=True):
            g.copy_(new.view_as(g))

    assert lk.exercises.check(NAME, flat).status == "passed"
    assert "correct" in capsys.readouterr().out


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(params, n_tokens, group=None):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _plain_average(params, n_tokens, group=None):
    for q in params:
        dist.all_reduce(q.grad, group=group)
        q.grad /= dist.get_world_size(group)


def _sum(params, n_tokens, group=None):
    for q in params:
        dist.all_reduce(q.grad, group=group)


def _divides_by_local_count(params, n_tokens, group=None):
    for q in params:
        q.grad *= n_tokens
        dist.all_reduce(q.grad, group=group)
        q.grad /= n_tokens


def _never_divides(params, n_tokens, group=None):
    for q in params:
        q.grad *= n_tokens
        dist.all_reduce(q.grad, group=group)


def _local_only(params, n_tokens, group=None):
    total = torch.tensor(float(n_tokens))
    dist.all_reduce(total, group=group)  # communicates, but never the gradients


def _reduce_to_rank_0(params, n_tokens, group=None):
    total = torch.tensor(float(n_tokens))
    dist.all_reduce(total, group=group)
    for q in params:
        q.grad *= n_tokens
        dist.reduce(q.grad, dst=0, group=group)
        q.grad /= total


def _skips_vectors(params, n_tokens, group=None):
    nb21.token_weighted_average([q for q in params if q.dim() > 1], n_tokens, group)


def _drops_grads(params, n_tokens, group=None):
    for q in params:
        q.grad = None


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (_plain_average, r"plain average .* they hold \[11, 7\]"),
        (_sum, "sum of the ranks' mean gradients"),
        (_divides_by_local_count, r"divided by this rank's n_tokens \(11\).*total .* \(18\)"),
        (_never_divides, r"weighted sum: divide it by the total token count \(18\)"),
        (_local_only, "still this rank's own gradient"),
        (_reduce_to_rank_0, "the ranks disagree"),
        (_skips_vectors, r"rank 0: \S+(bias|weight)\.grad differs"),
        (_drops_grads, "grad is None afterwards"),
        (lambda params, n_tokens, group=None: params[99], "IndexError"),
    ],
    ids=[
        "plain-average",
        "sum",
        "local-count",
        "no-division",
        "no-all-reduce",
        "reduce",
        "skips-vectors",
        "drops-grads",
        "raises",
    ],
)
def test_wrong_answers_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)
