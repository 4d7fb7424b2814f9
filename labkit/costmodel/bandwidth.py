"""Algorithm bandwidth and bus bandwidth, with nccl-tests' correction factors.

Introduced in notebooks/05_communication_cost.ipynb.

nccl-tests (``doc/PERFORMANCE.md``) reports two bandwidths for a collective of size S bytes
that took t seconds: ``algbw = S / t``, and ``busbw = algbw · factor(p)``, where the factor
turns algbw into the speed of the busiest link, so busbw can be compared with the hardware's
peak whatever the number of ranks: all-reduce 2(p−1)/p; reduce-scatter, all-gather and
all-to-all (p−1)/p; broadcast and reduce 1. Gather and scatter use (p−1)/p (nccl-tests'
``src/gather.cu``, ``src/scatter.cu``); a point-to-point transfer 1. GB are 10⁹ bytes.
"""

from __future__ import annotations

__all__ = ["algbw", "busbw", "busbw_factor"]

_FACTORS = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "gather": lambda p: (p - 1) / p,
    "scatter": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
    "p2p": lambda p: 1.0,
}


def busbw_factor(collective: str, world_size: int) -> float:
    """nccl-tests' factor from algbw to busbw for ``collective`` on ``world_size`` ranks.

    nccl-tests ``doc/PERFORMANCE.md`` ("Summary"): all_reduce 2(n−1)/n; reduce_scatter,
    all_gather, all_to_all (n−1)/n; broadcast, reduce 1 (gather, scatter: (n−1)/n as in
    ``src/gather.cu``; p2p: 1).

    Args:
        collective: ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``, ``"broadcast"``,
            ``"reduce"``, ``"all_to_all"``, ``"gather"``, ``"scatter"`` or ``"p2p"``.
        world_size: number of ranks n (≥ 1).

    Returns:
        The factor (0 for a collective other than broadcast/reduce/p2p on one rank).

    Raises:
        ValueError: an unknown collective or ``world_size < 1``.
    """
    if collective not in _FACTORS:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(_FACTORS)}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    return float(_FACTORS[collective](world_size))


def algbw(n_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth S/t in GB/s (nccl-tests' ``algbw``).

    Args:
        n_bytes: the collective's size S (nccl-tests' convention, see ``formulas``).
        time_s: its duration in seconds (> 0).

    Returns:
        ``n_bytes / time_s / 1e9``.

    Raises:
        ValueError: ``time_s <= 0``.
    """
    if not time_s > 0:
        raise ValueError(f"time_s must be > 0, got {time_s!r}")
    return n_bytes / time_s / 1e9


def busbw(collective: str, n_bytes: float, time_s: float, world_size: int) -> float:
    """Bus bandwidth algbw · ``busbw_factor(collective, world_size)`` in GB/s.

    Args:
        collective: as ``busbw_factor``.
        n_bytes: the collective's size S.
        time_s: its duration in seconds (> 0).
        world_size: number of ranks.

    Returns:
        The bus bandwidth in GB/s.

    Raises:
        ValueError: as ``algbw`` and ``busbw_factor``.
    """
    return algbw(n_bytes, time_s) * busbw_factor(collective, world_size)
