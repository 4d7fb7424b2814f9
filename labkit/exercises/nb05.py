"""Exercises of notebooks/05_communication_cost.ipynb.

Introduced in notebooks/05_communication_cost.ipynb.

``05_ring_cost``: derive the α-β-γ cost of notebook 03's ring all-reduce from the algorithm
itself (the notebook asks before it prints ``lk.costmodel``'s table). The checker is pure
arithmetic: it compares the learner's function with ``lk.costmodel.predict("all_reduce", n,
p, network, "ring")`` (Thakur, Rabenseifner and Gropp 2005, §4) for p from 1 to 64 and a few
thousand, sizes from 0 to 1 GB and several networks. When they differ it evaluates the
latency, bandwidth and reduction terms one at a time (the other two parameters set to 0)
and says which one is off and what to count again, without printing the formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from labkit.costmodel import Network, predict
from labkit.exercises import ExerciseFailed, exercise

WORLD_SIZES = (*range(1, 65), 100, 1000, 1024, 4096)
SIZES = (0, 1, 1000, 4096, 1 << 20, 1 << 30)
NETWORKS = (
    Network(latency_us=20.0, bandwidth_gbps=1.25, gamma_s_per_byte=0.1e-9),  # 10GbE
    Network(latency_us=1.0, bandwidth_gbps=12.5, gamma_s_per_byte=0.05e-9),  # 100Gb-IB
    Network(latency_us=1600.0, bandwidth_gbps=0.8, gamma_s_per_byte=0.5e-9),  # gloo, laptop
)
REL_TOL = 1e-9

PROMPT = """Write `my_ring_cost(n_bytes, world_size, alpha, beta, gamma)`: the time in seconds of
notebook 03's ring all-reduce of n bytes on p ranks, in the α-β-γ model — a message of m bytes
costs α + mβ, reducing m bytes costs mγ, and a rank sends one message while it receives one.
Derive it from the algorithm: how many steps each phase takes, how many bytes a rank sends in
one step, and how many bytes it adds up (in which phase)."""


def ring_allreduce_cost(
    n_bytes: float, world_size: int, alpha: float, beta: float, gamma: float
) -> float:
    """The ring all-reduce's α-β-γ cost: 2(p−1)α + 2(p−1)/p·nβ + (p−1)/p·nγ, in seconds.

    Reference solution of exercise ``05_ring_cost``; ``lk.costmodel.predict("all_reduce", n,
    p, net, "ring")`` is the same. Thakur, Rabenseifner and Gropp 2005, §4: p−1 steps of the
    reduce-scatter and p−1 of the all-gather, each sending one chunk of n/p bytes; only the
    reduce-scatter adds what it receives.

    Args:
        n_bytes: the tensor's size n in bytes.
        world_size: number of ranks p (≥ 1).
        alpha: latency α in seconds.
        beta: time per byte β in seconds.
        gamma: time to reduce one byte γ in seconds.

    Returns:
        The predicted time in seconds (0 on one rank).
    """
    p = world_size
    return 2 * (p - 1) * alpha + (p - 1) / p * n_bytes * (2 * beta + gamma)


def _expected(n: float, p: int, alpha: float, beta: float, gamma: float) -> float:
    return predict("all_reduce", n, p, Network.from_alpha_beta(alpha, beta, gamma), "ring")


def _call(fn: Callable[..., Any], n: float, p: int, a: float, b: float, g: float) -> float:
    args = f"my_ring_cost({n}, {p}, {a}, {b}, {g})"
    try:
        got = fn(n, p, a, b, g)
    except TypeError as exc:
        if "argument" not in str(exc):
            raise
        raise ExerciseFailed(
            f"{args} raised {exc}; take five arguments: n_bytes, world_size, alpha, beta, gamma"
        ) from None
    try:
        value = float(got)
    except (TypeError, ValueError):
        raise ExerciseFailed(f"{args} returned {got!r}; return a number of seconds") from None
    if not math.isfinite(value):
        raise ExerciseFailed(f"{args} returned {value}")
    return value


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-18)


def _diagnose(
    fn: Callable[..., Any], n: float, p: int, alpha: float, beta: float, gamma: float
) -> str:
    """Which term is off: latency (β = γ = 0), bandwidth (α = γ = 0) or reduction (α = β = 0)."""
    want = {
        "latency": 2 * (p - 1) * alpha,
        "bandwidth": 2 * (p - 1) / p * n * beta,
        "reduction": (p - 1) / p * n * gamma,
    }
    got = {
        "latency": _call(fn, 0, p, alpha, 0.0, 0.0),
        "bandwidth": _call(fn, n, p, 0.0, beta, 0.0),
        "reduction": _call(fn, n, p, 0.0, 0.0, gamma),
    }
    if not _close(got["latency"], want["latency"]):
        return (
            f"the latency term is off: with β = γ = 0 you give {got['latency'] / alpha:g}·α on "
            f"p = {p} ranks. Count the steps again: a step is one message per rank, all at once; "
            "how many steps until every rank owns one fully reduced chunk (how many other "
            "ranks must a chunk visit?), and how many more until every rank holds every chunk?"
        )
    if not _close(got["bandwidth"], want["bandwidth"]):
        return (
            f"the bandwidth term is off: with α = γ = 0 you give "
            f"{got['bandwidth'] / (n * beta):g}·nβ on p = {p} ranks. A rank sends one chunk per "
            "step, not the whole tensor: how many bytes is a chunk, and how many steps are there?"
        )
    if not _close(got["reduction"], want["reduction"]):
        return (
            f"the reduction term is off: with α = β = 0 you give "
            f"{got['reduction'] / (n * gamma):g}·nγ on p = {p} ranks. Which phase adds up what "
            "arrives, and how many bytes does one rank add in it?"
        )
    return "each term alone is right, but their sum is not: add the three terms"


@exercise("05_ring_cost", reference=ring_allreduce_cost, prompt=PROMPT)
def check_ring_cost(fn: Callable[..., Any]) -> dict[str, int]:
    """Check a derived ring all-reduce cost against ``lk.costmodel`` for many p, n and networks.

    Args:
        fn: the learner's ``fn(n_bytes, world_size, alpha, beta, gamma) -> seconds``.

    Returns:
        ``{"cases": number of (p, n, network) combinations checked}``.

    Raises:
        ExerciseFailed: a case differs (relative tolerance 1e-9); the message names the
            case and which term (latency, bandwidth or reduction) is wrong.
        NotImplementedError: from ``fn`` (not attempted yet).
    """
    cases = 0
    for net in NETWORKS:
        a, b, g = net.alpha, net.beta, net.gamma
        for p in WORLD_SIZES:
            for n in SIZES:
                got, want = _call(fn, n, p, a, b, g), _expected(n, p, a, b, g)
                if not _close(got, want):
                    raise ExerciseFailed(
                        f"for n = {n} bytes on p = {p} ranks with α = {a:g} s, β = {b:g} s/byte "
                        f"and γ = {g:g} s/byte you give {got:.6g} s, the ring takes "
                        f"{want:.6g} s: {_diagnose(fn, max(n, 1), p, a, b, g)}"
                    )
                cases += 1
    return {"cases": cases}
