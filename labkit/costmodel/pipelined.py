"""The pipelined tree all-reduce: cut the data into k segments and stream them along trees.

Introduced in notebooks/05_communication_cost.ipynb.

The ``tree`` all-reduce of the other formulas sends the whole tensor at every level of a
binomial tree, so its bandwidth term grows like 2⌈lg p⌉·nβ. Cutting the data into k segments
lets every level work on a different segment at once (a pipeline): the depth is paid once,
in latency, and each byte crosses each link once. This is the double binary tree (two-tree)
all-reduce NCCL uses (NCCL 2.4; Jeaugey, "Massively Scale Your Deep Learning Training with
NCCL 2.4", NVIDIA blog, 2019), after Sanders, Speck and Träff, "Two-tree algorithms for full
bandwidth broadcast, reduction and scan", Parallel Computing 35(12):581–594, 2009:

- two binary trees span the p ranks, each carrying half of the data, and every rank is an
  inner node of at most one of them; a broadcast over both takes at most 2⌈lg p⌉ + 2k steps
  of one segment of n/(2k) bytes each (Sanders et al.), i.e. (2⌈lg p⌉ + 2k)(α + nβ/(2k));
- a reduction is the same schedule run backwards, with each segment received also reduced;
- the all-reduce is the reduction followed by the broadcast:

      t(k) = (4⌈lg p⌉ + 4k)·α + 2(1 + ⌈lg p⌉/k)·nβ + (1 + ⌈lg p⌉/k)·nγ

  (NCCL overlaps the two halves; the sum is the model's upper bound). The best k balances
  the 4kα of more segments against the 2⌈lg p⌉nβ/k of the pipeline's fill:
  k* = √(⌈lg p⌉·n·(2β + γ) / (4α)). As n grows the bandwidth term tends to 2nβ, and the
  ring's 2(p−1)/p·nβ tends to the same 2nβ as p grows: for large p and large n the two cost
  the same, while the tree's latency grows like lg p instead of p.
"""

from __future__ import annotations

import math

from labkit.costmodel.terms import CostTerms

__all__ = ["best_segments", "pipelined_tree_terms"]


def _depth(p: int) -> int:
    return (p - 1).bit_length()  # ⌈lg p⌉


def pipelined_tree_terms(world_size: int, segments: int) -> CostTerms:
    """The α, n·β, n·γ coefficients of the pipelined double-binary-tree all-reduce.

    t(k) = (4⌈lg p⌉ + 4k)α + 2(1 + ⌈lg p⌉/k)nβ + (1 + ⌈lg p⌉/k)nγ, from Sanders, Speck and
    Träff 2009 (two-tree broadcast in 2⌈lg p⌉ + 2k steps; reduction its mirror image).

    Args:
        world_size: number of ranks p (≥ 1).
        segments: k, the segments each half of the data is cut into (≥ 1).

    Returns:
        The ``CostTerms`` (all zero for p = 1).

    Raises:
        ValueError: ``segments`` is not an int ≥ 1.
    """
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ValueError(f"segments must be an int >= 1, got {segments!r}")
    lg, k = _depth(world_size), segments
    if lg == 0:
        return CostTerms(0, 0, 0, "0 (one rank)", "nothing to communicate")
    return CostTerms(
        4 * (lg + k),
        2 * (1 + lg / k),
        1 + lg / k,
        "(4⌈lg p⌉ + 4k)α + 2(1 + ⌈lg p⌉/k)nβ + (1 + ⌈lg p⌉/k)nγ",
        "Sanders, Speck, Träff 2009 (two-tree); NCCL's double binary tree",
    )


def best_segments(
    n_bytes: float, world_size: int, alpha: float, beta: float, gamma: float = 0.0
) -> int:
    """The segment count k that minimises ``pipelined_tree_terms`` for ``n_bytes``.

    k* = √(⌈lg p⌉·n·(2β + γ) / (4α)), rounded to the better of its two integer neighbours,
    at least 1 and at most n (a segment holds at least one byte).

    Args:
        n_bytes: the tensor's size n.
        world_size: number of ranks p.
        alpha: latency α in seconds.
        beta: time per byte β in seconds.
        gamma: reduction time per byte γ in seconds.

    Returns:
        The best k (1 for p = 1 or n < 1).

    Raises:
        Nothing of its own.
    """
    lg = _depth(world_size)
    most = max(1, int(n_bytes))
    if lg == 0 or n_bytes < 1:
        return 1
    if alpha == 0:
        return most  # segments are free: as many as there are bytes
    k_star = math.sqrt(lg * n_bytes * (2 * beta + gamma) / (4 * alpha))
    candidates = {min(most, max(1, math.floor(k_star))), min(most, max(1, math.ceil(k_star)))}

    def cost(k: int) -> float:
        return pipelined_tree_terms(world_size, k).time_s(n_bytes, alpha, beta, gamma)

    return min(sorted(candidates), key=cost)
