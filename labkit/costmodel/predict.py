"""Predictions from the α-β-γ formulas: time, best algorithm, crossover size, cluster what-if.

Introduced in notebooks/05_communication_cost.ipynb.

Every formula is linear in n (``t = steps·α + n·(bytes·β + reduce·γ)``), so the size at which
a latency-bound algorithm (few steps, many bytes) and a bandwidth-bound one (many steps, few
bytes) cost the same has a closed form:

    n* = (steps_B − steps_A)·α / ((bytes_A − bytes_B)·β + (reduce_A − reduce_B)·γ)

e.g. all-reduce by recursive doubling (A) vs ring (B) on a power-of-two p with γ = 0:
n* = (2(p−1) − lg p) / (lg p − 2(p−1)/p) · α/β (Thakur, Rabenseifner and Gropp 2005, §4 and
§2; MPICH switches algorithms at such thresholds).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from labkit.costmodel.bandwidth import busbw, busbw_factor
from labkit.costmodel.formulas import ALGORITHMS, DEFAULT_ALGORITHM, SEGMENTED, cost_terms
from labkit.costmodel.network import Network
from labkit.costmodel.pipelined import best_segments

__all__ = ["best_algorithm", "crossover_bytes", "predict", "predict_all", "what_if"]


def _check_bytes(n_bytes: float) -> float:
    if isinstance(n_bytes, bool) or not n_bytes >= 0:
        raise ValueError(f"n_bytes must be >= 0, got {n_bytes!r}")
    return float(n_bytes)


def predict(
    collective: str,
    n_bytes: float,
    world_size: int,
    network: Network,
    algorithm: str | None = None,
) -> float:
    """Predicted time of one collective in seconds, by the α-β-γ model.

    Thakur, Rabenseifner and Gropp 2005 (§ per algorithm: ``cost_terms(...).source``).

    Args:
        collective: ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``, ``"broadcast"``,
            ``"reduce"``, ``"gather"``, ``"scatter"``, ``"all_to_all"`` or ``"p2p"``.
        n_bytes: the size in nccl-tests' convention (all_gather: the gathered output;
            reduce_scatter and all_to_all: each rank's whole input).
        world_size: number of ranks p.
        network: the ``Network`` (α, β, γ).
        algorithm: e.g. ``"ring"``, ``"tree"``, ``"recursive_doubling"``; None: the
            collective's default (``DEFAULT_ALGORITHM``). For ``"pipelined_tree"`` the
            segment count is the best one for this size (``best_segments``).

    Returns:
        The time in seconds (0 on one rank, where nothing moves).

    Raises:
        ValueError: unknown collective or algorithm, ``world_size < 1``, ``n_bytes < 0``.
    """
    n = _check_bytes(n_bytes)
    segments = None
    if (collective, algorithm or DEFAULT_ALGORITHM.get(collective)) in SEGMENTED:
        segments = best_segments(n, world_size, network.alpha, network.beta, network.gamma)
    terms = cost_terms(collective, world_size, algorithm, segments=segments)
    return terms.time_s(n, network.alpha, network.beta, network.gamma)


def predict_all(
    collective: str, n_bytes: float, world_size: int, network: Network
) -> dict[str, float]:
    """``predict`` for every algorithm of ``collective``: algorithm → seconds.

    Args:
        collective: as ``predict``.
        n_bytes: as ``predict``.
        world_size: number of ranks.
        network: the ``Network``.

    Returns:
        One time per algorithm of ``ALGORITHMS[collective]``, in its order.

    Raises:
        ValueError: as ``predict``.
    """
    if collective not in ALGORITHMS:
        cost_terms(collective, world_size)  # raises with the list of collectives
    return {a: predict(collective, n_bytes, world_size, network, a) for a in ALGORITHMS[collective]}


def best_algorithm(
    collective: str,
    n_bytes: float,
    world_size: int,
    network: Network,
    algorithms: Iterable[str] | None = None,
) -> str:
    """The algorithm the model predicts fastest (the first listed wins a tie).

    Args:
        collective: as ``predict``.
        n_bytes: as ``predict``.
        world_size: number of ranks.
        network: the ``Network``.
        algorithms: candidates (default: every algorithm of ``collective``).

    Returns:
        The name of the fastest algorithm.

    Raises:
        ValueError: as ``predict``, or no candidates.
    """
    times = predict_all(collective, n_bytes, world_size, network)
    names = list(algorithms) if algorithms is not None else list(times)
    if not names:
        raise ValueError("best_algorithm needs at least one candidate algorithm")
    for a in names:
        if a not in times:
            cost_terms(collective, world_size, a)  # raises with the known algorithms
    return min(names, key=lambda a: times[a])


def crossover_bytes(
    collective: str, world_size: int, network: Network, algorithm_a: str, algorithm_b: str
) -> float | None:
    """The message size at which two algorithms cost the same, in closed form.

    Both costs are linear in n, so n* = (steps_b − steps_a)·α / ((bytes_a − bytes_b)·β +
    (reduce_a − reduce_b)·γ) (this module's docstring; Thakur, Rabenseifner and Gropp 2005).
    Below n* the algorithm with fewer steps is faster, above it the one with fewer bytes.

    Args:
        collective: as ``predict``.
        world_size: number of ranks.
        network: the ``Network``.
        algorithm_a: one algorithm (typically the latency-bound one, e.g. recursive doubling).
        algorithm_b: the other (typically the bandwidth-bound one, e.g. ring).

    Returns:
        n* in bytes (> 0), or None when the lines never cross at a positive size (one
        algorithm is never slower, or they always cost the same).

    Raises:
        ValueError: as ``predict``, or a segmented algorithm (the pipelined tree), whose cost
            is not linear in n.
    """
    for algorithm in (algorithm_a, algorithm_b):
        if (collective, algorithm) in SEGMENTED:
            raise ValueError(
                f"{algorithm}'s cost is not linear in n (its best segment count grows with "
                "n), so there is no closed-form crossover; compare predict() over sizes"
            )
    a = cost_terms(collective, world_size, algorithm_a)
    b = cost_terms(collective, world_size, algorithm_b)
    num = (b.steps - a.steps) * network.alpha
    den = (a.bytes - b.bytes) * network.beta + (a.reduce - b.reduce) * network.gamma
    if den == 0:
        return None
    n_star = num / den
    return n_star if n_star > 0 else None


def what_if(
    collective: str,
    n_bytes: float,
    world_sizes: Sequence[int],
    network: Network,
    algorithms: Iterable[str] | None = None,
) -> list[dict]:
    """Predicted time and bus bandwidth at every world size, e.g. thousands of ranks.

    Args:
        collective: as ``predict``.
        n_bytes: as ``predict``.
        world_sizes: the ranks to try (e.g. ``[8, 64, 1024, 8192]``).
        network: the ``Network``.
        algorithms: which algorithms (default: all of ``collective``).

    Returns:
        One row per (world size, algorithm): ``{"world_size", "algorithm", "time_s",
        "busbw_gbps", "busbw_fraction"}``; ``busbw_fraction`` is busbw over the network's
        bandwidth (1.0 = the links run at full speed; None when busbw's factor is 0).

    Raises:
        ValueError: as ``predict``.
    """
    names = list(algorithms) if algorithms is not None else list(ALGORITHMS.get(collective, []))
    rows = []
    for p in world_sizes:
        for a in names:
            t = predict(collective, n_bytes, p, network, a)
            bw = busbw(collective, n_bytes, t, p) if t > 0 else None
            frac = bw / network.bandwidth_gbps if bw and busbw_factor(collective, p) else None
            rows.append(
                {
                    "world_size": p,
                    "algorithm": a,
                    "time_s": t,
                    "busbw_gbps": bw,
                    "busbw_fraction": frac,
                }
            )
    return rows
