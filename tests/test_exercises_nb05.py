"""Tests for labkit/exercises/nb05.py: the reference passes, wrong derivations fail with a
reason, and neither the prompt nor a failure message prints the formula."""

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
    def via_costmodel(n_bytes, world_size, alpha, beta, gamma):
        net = lk.Network.from_alpha_beta(alpha, beta, gamma)
        return lk.costmodel.predict("all_reduce", n_bytes, world_size, net, "ring")

    def two_phases(n_bytes, world_size, alpha, beta, gamma):
        p, chunk = world_size, n_bytes / world_size
        reduce_scatter = (p - 1) * (alpha + chunk * beta + chunk * gamma)
        all_gather = (p - 1) * (alpha + chunk * beta)
        return reduce_scatter + all_gather

    assert lk.exercises.check(NAME, via_costmodel).status == "passed"
    assert lk.exercises.check(NAME, two_phases).status == "passed"


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(n_bytes, world_size, alpha, beta, gamma):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _ring(n, p, a, b, g, steps=None, sent=None, reduced=None):
    """The ring's cost with one term replaced by a wrong derivation."""
    steps = 2 * (p - 1) if steps is None else steps
    sent = 2 * (p - 1) / p * n if sent is None else sent
    reduced = (p - 1) / p * n if reduced is None else reduced
    return steps * a + sent * b + reduced * g


WRONG = {
    # p·α per phase instead of (p−1)·α
    "p-steps": (lambda n, p, a, b, g: _ring(n, p, a, b, g, steps=2 * p), r"you give 2·α on p = 1"),
    "one-phase": (lambda n, p, a, b, g: _ring(n, p, a, b, g, steps=p - 1), "latency term"),
    # N instead of 2(p−1)/p·N
    "n-bytes": (lambda n, p, a, b, g: _ring(n, p, a, b, g, sent=n), r"you give 1·nβ on p = 1"),
    "whole-tensor-steps": (
        lambda n, p, a, b, g: _ring(n, p, a, b, g, sent=2 * (p - 1) * n),
        r"bandwidth term is off: with α = γ = 0 you give 2·nβ on p = 2",
    ),
    "2n-bytes": (lambda n, p, a, b, g: _ring(n, p, a, b, g, sent=2 * n), "bandwidth term"),
    "reduces-in-both-phases": (
        lambda n, p, a, b, g: _ring(n, p, a, b, g, reduced=2 * (p - 1) / p * n),
        r"reduction term is off: with α = β = 0 you give 1·nγ on p = 2",
    ),
    "no-gamma": (lambda n, p, a, b, g: _ring(n, p, a, b, 0.0), "reduction term"),
    "tree": (lambda n, p, a, b, g: 2 * math.log2(p) * (a + n * b), "bandwidth term"),
    "product": (lambda n, p, a, b, g: 2 * (p - 1) * a * 2 * (p - 1) / p * n * b, "latency term"),
    "string": (lambda n, p, a, b, g: f"{2 * (p - 1) * a} s", "return a number"),
    "four-arguments": (lambda n, p, a, b: 2 * (p - 1) * a, "take five arguments"),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_wrong_derivations_fail_with_a_reason(case) -> None:
    wrong, match = WRONG[case]
    with pytest.raises(ExerciseFailed, match=match) as info:
        lk.exercises.check(NAME, wrong)
    message = str(info.value)
    for formula in ("2(p−1)α", "2(p−1)/p", "(p−1)/p", "n/p"):  # hints, never the answer
        assert formula not in message


def test_the_prompt_does_not_give_the_answer() -> None:
    prompt = lk.exercises.get(NAME).prompt
    assert "my_ring_cost(n_bytes, world_size, alpha, beta, gamma)" in prompt
    for formula in ("2(p−1)", "p − 1", "p−1", "n/p", "(p-1)"):
        assert formula not in prompt
