"""The α-β-γ cost of each collective and algorithm, as coefficients of α, n·β and n·γ.

Introduced in notebooks/05_communication_cost.ipynb.

Every formula here has the form ``t(n) = steps·α + bytes·n·β + reduce·n·γ`` on ``p`` ranks,
where n is the collective's size in nccl-tests' convention (``doc/PERFORMANCE.md``):

- all_reduce, broadcast, reduce: n = bytes of the tensor;
- all_gather: n = bytes of the gathered output (p blocks); reduce_scatter: n = bytes of each
  rank's input (p blocks); gather / scatter: n = bytes at the root (p blocks);
- all_to_all: n = bytes of each rank's send buffer (p blocks, its own included);
- p2p: n = bytes of the one message.

Sources, by section of Thakur, Rabenseifner and Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 19(1):49-66, 2005 ("TRG"): §2 cost model; §3.1
all-gather; §3.2 broadcast (and the binomial scatter it starts with); §3.3 reduce-scatter;
§3.4 all-to-all; §4 reduce and all-reduce (Rabenseifner's algorithms). The same costs appear
in MPICH's source comments (``src/mpi/coll/*``). lg p = log2 p. For p not a power of two the
recursive algorithms first fold the p − p' extra ranks into partners (p' = 2^⌊lg p⌋, one
extra step of n bytes) and unfold at the end, as MPICH does (TRG §3.3, §4).
"""

from __future__ import annotations

from collections.abc import Callable

from labkit.costmodel.pipelined import pipelined_tree_terms
from labkit.costmodel.terms import CostTerms

__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "DEFAULT_ALGORITHM",
    "LABELS",
    "SEGMENTED",
    "CostTerms",
    "cost_terms",
]


def _lg_ceil(p: int) -> int:
    return (p - 1).bit_length()  # ⌈log2 p⌉; 0 for p = 1


def _pof2(p: int) -> int:
    return 1 << (p.bit_length() - 1)  # p' = 2^⌊log2 p⌋


def _frac(p: int) -> float:
    return (p - 1) / p  # the (p−1)/p of every bandwidth-optimal algorithm


# --- all_reduce: TRG §4 ---------------------------------------------------------------------


def _ar_ring(p: int) -> CostTerms:
    # Reduce-scatter then all-gather around a ring (TRG §4; Patarasuk and Yuan 2009).
    f = _frac(p)
    return CostTerms(2 * (p - 1), 2 * f, f, "2(p−1)α + 2(p−1)/p·nβ + (p−1)/p·nγ", "TRG §4 (ring)")


def _ar_tree(p: int) -> CostTerms:
    # Binomial-tree reduce to rank 0, then binomial-tree broadcast, whole tensor per message:
    # no pipelining (TRG §3.2, §4). ``pipelined_tree`` is the pipelined one.
    k = _lg_ceil(p)
    return CostTerms(
        2 * k, 2 * k, k, "2⌈lg p⌉(α + nβ) + ⌈lg p⌉·nγ", "TRG §3.2 + §4 (binomial, unpipelined)"
    )


def _ar_naive(p: int) -> CostTerms:
    # Everyone sends to rank 0, which reduces and sends back: 2(p−1) full messages in series.
    return CostTerms(
        2 * (p - 1), 2 * (p - 1), p - 1, "2(p−1)(α + nβ) + (p−1)·nγ", "TRG §2 model, linear"
    )


def _ar_recursive_doubling(p: int) -> CostTerms:
    # lg p exchanges of the whole vector (TRG §4, short messages); fold/unfold when p ≠ p'.
    q = _pof2(p)
    k = q.bit_length() - 1
    if q == p:
        return CostTerms(k, k, k, "lg p(α + nβ + nγ)", "TRG §4 (recursive doubling)")
    return CostTerms(
        k + 2, k + 2, k + 1, "(⌊lg p⌋+2)(α + nβ) + (⌊lg p⌋+1)nγ", "TRG §4 (rec. doubling, fold)"
    )


def _ar_rabenseifner(p: int) -> CostTerms:
    # Reduce-scatter by recursive halving + all-gather by recursive doubling (TRG §4).
    q = _pof2(p)
    k, f = q.bit_length() - 1, _frac(q)
    if q == p:
        return CostTerms(
            2 * k, 2 * f, f, "2lg p·α + 2(p−1)/p·nβ + (p−1)/p·nγ", "TRG §4 (Rabenseifner)"
        )
    return CostTerms(
        2 * k + 2,
        2 * f + 2,
        f + 1,
        "(2⌊lg p⌋+2)α + (2(p'−1)/p' + 2)nβ + ((p'−1)/p' + 1)nγ",
        "TRG §4 (Rabenseifner, fold)",
    )


# --- all_gather: TRG §3.1; reduce_scatter: TRG §3.3 ----------------------------------------


def _ag_ring(p: int) -> CostTerms:
    return CostTerms(p - 1, _frac(p), 0, "(p−1)α + (p−1)/p·nβ", "TRG §3.1 (ring)")


def _ag_recursive_doubling(p: int) -> CostTerms:
    # Power-of-two p: recursive doubling; otherwise Bruck's algorithm, same cost (TRG §3.1).
    return CostTerms(
        _lg_ceil(p), _frac(p), 0, "⌈lg p⌉α + (p−1)/p·nβ", "TRG §3.1 (rec. doubling / Bruck)"
    )


def _rs_ring(p: int) -> CostTerms:
    f = _frac(p)
    return CostTerms(p - 1, f, f, "(p−1)α + (p−1)/p·n(β + γ)", "TRG §3.3 (ring)")


def _rs_pairwise(p: int) -> CostTerms:
    # Step i: send n/p to rank+i, receive n/p from rank−i (TRG §3.3, long messages).
    f = _frac(p)
    return CostTerms(p - 1, f, f, "(p−1)α + (p−1)/p·n(β + γ)", "TRG §3.3 (pairwise)")


def _rs_recursive_halving(p: int) -> CostTerms:
    q = _pof2(p)
    k, f = q.bit_length() - 1, _frac(q)
    if q == p:
        return CostTerms(k, f, f, "lg p·α + (p−1)/p·n(β + γ)", "TRG §3.3 (recursive halving)")
    # Fold n bytes in, halve among p', send each folded rank its n/p block back.
    return CostTerms(
        k + 2,
        1 + f + 1 / p,
        1 + f,
        "(⌊lg p⌋+2)α + (1 + (p'−1)/p' + 1/p)nβ + (1 + (p'−1)/p')nγ",
        "TRG §3.3 (recursive halving, fold)",
    )


# --- broadcast: TRG §3.2; reduce: TRG §4; gather/scatter: TRG §3.1-3.2 ----------------------


def _bc_tree(p: int) -> CostTerms:
    k = _lg_ceil(p)
    return CostTerms(k, k, 0, "⌈lg p⌉(α + nβ)", "TRG §3.2 (binomial tree)")


def _bc_scatter_allgather(p: int) -> CostTerms:
    # Van de Geijn: binomial scatter, then ring all-gather (TRG §3.2, long messages).
    k = _lg_ceil(p)
    return CostTerms(
        k + p - 1,
        2 * _frac(p),
        0,
        "(⌈lg p⌉ + p − 1)α + 2(p−1)/p·nβ",
        "TRG §3.2 (scatter + ring all-gather)",
    )


def _red_tree(p: int) -> CostTerms:
    k = _lg_ceil(p)
    return CostTerms(k, k, k, "⌈lg p⌉(α + nβ + nγ)", "TRG §4 (binomial tree)")


def _red_reduce_scatter_gather(p: int) -> CostTerms:
    # Rabenseifner: reduce-scatter by recursive halving, then binomial gather (TRG §4).
    q = _pof2(p)
    k, f = q.bit_length() - 1, _frac(q)
    if q == p:
        return CostTerms(
            2 * k, 2 * f, f, "2lg p·α + 2(p−1)/p·nβ + (p−1)/p·nγ", "TRG §4 (Rabenseifner)"
        )
    return CostTerms(
        2 * k + 1,
        1 + 2 * f,
        1 + f,
        "(2⌊lg p⌋+1)α + (1 + 2(p'−1)/p')nβ + (1 + (p'−1)/p')nγ",
        "TRG §4 (Rabenseifner, fold)",
    )


def _rooted_tree(p: int) -> CostTerms:
    # Binomial gather/scatter: the root's link carries (p−1)/p·n (TRG §3.1-3.2).
    return CostTerms(_lg_ceil(p), _frac(p), 0, "⌈lg p⌉α + (p−1)/p·nβ", "TRG §3.2 (binomial)")


def _rooted_linear(p: int) -> CostTerms:
    return CostTerms(p - 1, _frac(p), 0, "(p−1)α + (p−1)/p·nβ", "TRG §2 model, linear")


# --- all_to_all: TRG §3.4; p2p: TRG §2 -------------------------------------------------------


def _a2a_pairwise(p: int) -> CostTerms:
    # p−1 steps, each sending one n/p block (MPICH writes nβ with n excluding the own block).
    return CostTerms(p - 1, _frac(p), 0, "(p−1)α + (p−1)/p·nβ", "TRG §3.4 (pairwise exchange)")


def _a2a_bruck(p: int) -> CostTerms:
    k = _lg_ceil(p)
    return CostTerms(k, k / 2, 0, "⌈lg p⌉α + ⌈lg p⌉·n/2·β", "TRG §3.4 (Bruck)")


def _p2p(p: int) -> CostTerms:
    return CostTerms(1, 1, 0, "α + nβ", "TRG §2; Hockney 1994")


ALGORITHMS: dict[str, dict[str, Callable[[int], CostTerms]]] = {
    "all_reduce": {
        "ring": _ar_ring,
        "tree": _ar_tree,
        "recursive_doubling": _ar_recursive_doubling,
        "rabenseifner": _ar_rabenseifner,
        "naive": _ar_naive,
        "pipelined_tree": pipelined_tree_terms,  # needs segments: see SEGMENTED
    },
    "all_gather": {"ring": _ag_ring, "recursive_doubling": _ag_recursive_doubling},
    "reduce_scatter": {
        "ring": _rs_ring,
        "recursive_halving": _rs_recursive_halving,
        "pairwise": _rs_pairwise,
    },
    "broadcast": {"tree": _bc_tree, "scatter_allgather": _bc_scatter_allgather},
    "reduce": {"tree": _red_tree, "reduce_scatter_gather": _red_reduce_scatter_gather},
    "gather": {"tree": _rooted_tree, "linear": _rooted_linear},
    "scatter": {"tree": _rooted_tree, "linear": _rooted_linear},
    "all_to_all": {"pairwise": _a2a_pairwise, "bruck": _a2a_bruck},
    "p2p": {"direct": _p2p},
}
COLLECTIVES: tuple[str, ...] = tuple(ALGORITHMS)

# Algorithms whose cost also depends on how many segments the data is cut into; their table
# entry takes ``(p, segments)`` and ``predict`` picks the best segment count for each n.
SEGMENTED: frozenset[tuple[str, str]] = frozenset({("all_reduce", "pipelined_tree")})

# What to call each algorithm in tables and legends where the short key could mislead.
LABELS: dict[str, str] = {
    "tree": "binomial tree (unpipelined)",
    "pipelined_tree": "double binary tree (pipelined)",
    "recursive_doubling": "recursive doubling",
    "rabenseifner": "Rabenseifner (halving + doubling)",
}

# What ``predict`` uses when no algorithm is named: the bandwidth-optimal one for the
# collectives that have it (ring), the binomial tree for rooted ones.
DEFAULT_ALGORITHM: dict[str, str] = {
    "all_reduce": "ring",
    "all_gather": "ring",
    "reduce_scatter": "ring",
    "broadcast": "tree",
    "reduce": "tree",
    "gather": "tree",
    "scatter": "tree",
    "all_to_all": "pairwise",
    "p2p": "direct",
}


def cost_terms(
    collective: str,
    world_size: int,
    algorithm: str | None = None,
    *,
    segments: int | None = None,
) -> CostTerms:
    """The α, n·β and n·γ coefficients of ``collective`` by ``algorithm`` on ``world_size`` ranks.

    Thakur, Rabenseifner and Gropp 2005 (section per algorithm in ``CostTerms.source``).

    Args:
        collective: a key of ``ALGORITHMS`` (``"all_reduce"``, ``"all_gather"``, ...).
        world_size: number of ranks p (≥ 1; ``p2p`` ignores it).
        algorithm: a key of ``ALGORITHMS[collective]``; None: ``DEFAULT_ALGORITHM``.
        segments: for the algorithms in ``SEGMENTED`` (the pipelined tree), how many
            segments the data is cut into; must be None for every other algorithm.

    Returns:
        The ``CostTerms``; all zero for p = 1 (nothing to communicate), except ``p2p``.

    Raises:
        ValueError: an unknown collective or algorithm, ``world_size < 1``, or ``segments``
            missing for a segmented algorithm (or given for another one).
    """
    if collective not in ALGORITHMS:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    algorithm = algorithm or DEFAULT_ALGORITHM[collective]
    table = ALGORITHMS[collective]
    if algorithm not in table:
        raise ValueError(
            f"unknown algorithm {algorithm!r} for {collective}; known: {', '.join(table)}"
        )
    if (collective, algorithm) in SEGMENTED:
        if segments is None:
            raise ValueError(
                f"the cost of {algorithm} depends on how many segments the data is cut into: "
                "pass segments=k, or call predict(), which picks the best k for the size"
            )
        return table[algorithm](world_size, segments)
    if segments is not None:
        raise ValueError(f"{algorithm} does not pipeline segments; leave segments=None")
    return table[algorithm](world_size)
