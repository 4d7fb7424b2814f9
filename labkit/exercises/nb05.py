"""Exercises of notebooks/05_communication_cost.ipynb.

Introduced in notebooks/05_communication_cost.ipynb.

``05_ring_cost``: write the α-β cost of the ring all-reduce, ``2(p−1)α + 2(p−1)/p·nβ``
(Thakur, Rabenseifner and Gropp 2005, §4; reduction cost γ left out). The checker is pure
arithmetic: it compares the learner's function with ``lk.costmodel.predict("all_reduce", n,
p, network, "ring")`` for p from 1 to 64 and a few thousand, sizes from 0 to 1 GB and several
networks, and when they differ it tests the latency term (β = 0) and the bandwidth term
(α = 0) separately to say which one is wrong.
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
    Network(latency_us=20.0, bandwidth_gbps=1.25),  # 10GbE
    Network(latency_us=1.0, bandwidth_gbps=12.5),  # 100Gb-IB
    Network(latency_us=1600.0, bandwidth_gbps=0.8),  # gloo on a shared laptop
)
REL_TOL = 1e-9

PROMPT = """Write `my_ring_cost(n_bytes, world_size, alpha, beta)`: the time in seconds of a ring
all-reduce of n bytes on p ranks in the α-β model — reduce-scatter, then all-gather, each
p − 1 steps of one n/p-byte chunk per rank. Leave out the reduction cost γ."""


def ring_allreduce_cost(n_bytes: float, world_size: int, alpha: float, beta: float) -> float:
    """The ring all-reduce's α-β cost: 2(p−1)α + 2(p−1)/p·nβ, in seconds.

    Reference solution of exercise ``05_ring_cost``; ``lk.costmodel.predict("all_reduce", n,
    p, net, "ring")`` is the same with γ = 0. Thakur, Rabenseifner and Gropp 2005, §4.

    Introduced in notebooks/05_communication_cost.ipynb.

    Args:
        n_bytes: the tensor's size n in bytes.
        world_size: number of ranks p (≥ 1).
        alpha: latency α in seconds.
        beta: time per byte β in seconds.

    Returns:
        The predicted time in seconds (0 on one rank).
    """
    p = world_size
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes * beta


def _expected(n: float, p: int, alpha: float, beta: float) -> float:
    return predict("all_reduce", n, p, Network.from_alpha_beta(alpha, beta), "ring")


def _call(fn: Callable[..., Any], n: float, p: int, alpha: float, beta: float) -> float:
    got = fn(n, p, alpha, beta)
    try:
        value = float(got)
    except (TypeError, ValueError):
        raise ExerciseFailed(
            f"my_ring_cost({n}, {p}, {alpha}, {beta}) returned {got!r}; return a number of seconds"
        ) from None
    if not math.isfinite(value):
        raise ExerciseFailed(f"my_ring_cost({n}, {p}, {alpha}, {beta}) returned {value}")
    return value


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-18)


def _diagnose(fn: Callable[..., Any], n: float, p: int, alpha: float, beta: float) -> str:
    """Say which term is wrong: the latency one (β = 0) or the bandwidth one (α = 0)."""
    lat, want_lat = _call(fn, 0, p, alpha, 0.0), 2 * (p - 1) * alpha
    if not _close(lat, want_lat):
        steps = lat / alpha if alpha else float("nan")
        return (
            f"the latency term is off: with β = 0 you give {steps:g}·α on {p} ranks, the ring "
            f"takes 2(p−1) = {2 * (p - 1)} steps (p − 1 for the reduce-scatter, p − 1 for the "
            "all-gather), each one α"
        )
    bw, want_bw = _call(fn, n, p, 0.0, beta), 2 * (p - 1) / p * n * beta
    if not _close(bw, want_bw):
        factor = bw / (n * beta) if n and beta else float("nan")
        return (
            f"the bandwidth term is off: with α = 0 you give {factor:g}·nβ on {p} ranks, the "
            f"ring sends 2(p−1)/p·n = {2 * (p - 1) / p:g}·n bytes per rank — 2(p−1) chunks "
            "of n/p bytes, not of n"
        )
    return "each term alone is right, but their sum is not: add the latency and bandwidth terms"


@exercise("05_ring_cost", reference=ring_allreduce_cost, prompt=PROMPT)
def check_ring_cost(fn: Callable[..., Any]) -> dict[str, int]:
    """Check a ring all-reduce cost formula against ``lk.costmodel`` for many p, n and networks.

    Introduced in notebooks/05_communication_cost.ipynb.

    Args:
        fn: the learner's ``fn(n_bytes, world_size, alpha, beta) -> seconds``.

    Returns:
        ``{"cases": number of (p, n, network) combinations checked}``.

    Raises:
        ExerciseFailed: a case differs (relative tolerance 1e-9); the message names the
            case and which term (latency or bandwidth) is wrong.
        NotImplementedError: from ``fn`` (not attempted yet).
    """
    cases = 0
    for net in NETWORKS:
        for p in WORLD_SIZES:
            for n in SIZES:
                got = _call(fn, n, p, net.alpha, net.beta)
                want = _expected(n, p, net.alpha, net.beta)
                if not _close(got, want):
                    raise ExerciseFailed(
                        f"for n = {n} bytes on p = {p} ranks with α = {net.alpha:g} s and "
                        f"β = {net.beta:g} s/byte you give {got:.6g} s, the ring takes "
                        f"{want:.6g} s: {_diagnose(fn, max(n, 1), p, net.alpha, net.beta)}"
                    )
                cases += 1
    return {"cases": cases}
