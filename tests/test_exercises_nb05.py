"""Tests for labkit/exercises/nb05.py: the reference passes, wrong formulas fail with a reason."""

from __future__ import annotations

import math

import pytest

import labkit as lk
from labkit.exercises import ExerciseFailed, nb05

NAME = "05_ring_cost"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb05.ring_allreduce_cost
    cases = len(nb05.NETWORKS) * len(nb05.WORLD_SIZES) * len(nb05.SIZES)
    assert ex.checker(ex.reference) == {"cases": cases}


def test_costmodel_and_an_equivalent_rewrite_pass() -> None:
    def via_costmodel(n_bytes, world_size, alpha, beta):
        net = lk.Network.from_alpha_beta(alpha, beta)
        return lk.costmodel.predict("all_reduce", n_bytes, world_size, net, "ring")

    def two_phases(n_bytes, world_size, alpha, beta):
        p = world_size
        phase = (p - 1) * (alpha + n_bytes / p * beta)  # reduce-scatter = all-gather
        return 2 * phase

    assert lk.exercises.check(NAME, via_costmodel).status == "passed"
    assert lk.exercises.check(NAME, two_phases).status == "passed"


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(n_bytes, world_size, alpha, beta):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda n, p, a, b: 2 * (p - 1) * a + 2 * (p - 1) * n * b, "bandwidth term is off"),
        (lambda n, p, a, b: (p - 1) * a + (p - 1) / p * n * b, "latency term is off"),
        (lambda n, p, a, b: 2 * math.log2(p) * (a + n * b), "bandwidth term is off"),  # p = 2
        (lambda n, p, a, b: 2 * (p - 1) * a + 2 * n * b, r"you give 2·nβ"),
        (lambda n, p, a, b: 2 * p * a + 2 * (p - 1) / p * n * b, "2\\(p−1\\) = 0 steps"),
        (lambda n, p, a, b: 2 * (p - 1) * a * 2 * (p - 1) / p * n * b, "latency term"),
        (lambda n, p, a, b: f"{2 * (p - 1) * a} s", "return a number"),
    ],
    ids=["whole-buffer", "one-phase", "tree", "no-p", "p-steps", "product", "string"],
)
def test_wrong_formulas_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)
