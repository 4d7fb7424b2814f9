"""Recursive-doubling all-reduce: log2 p pairwise exchanges of the whole tensor.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

In step k rank r exchanges its partial result with rank r XOR 2^k and combines the two, so
after step k every block of 2^(k+1) ranks holds the same partial result, and after log2 p
steps every rank holds the full one: log2 p · (α + nβ), the fewest rounds of any algorithm
here, hence the best for short messages (Thakur, Rabenseifner and Gropp 2005, §4).

When p is not a power of two, with p' the largest power of two below p and rem = p − p'
(MPICH's scheme, same section): among the first 2·rem ranks, each even rank sends its tensor
to the odd rank above it and sits out; the p' remaining ranks run recursive doubling; then
each of those odd ranks sends the result back to its even partner.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from labkit.collectives.counting import P2P
from labkit.collectives.expected import largest_power_of_two
from labkit.collectives.fold import fold_in, group_rank, unfold
from labkit.collectives.ops import combine_, finish_, run_allreduce

__all__ = ["allreduce_recursive_doubling"]

ReduceOp = dist.ReduceOp


def _exchange_and_combine(p2p: P2P, flat: torch.Tensor, op: str) -> None:
    """The whole algorithm on a contiguous buffer."""
    p = p2p.world_size
    p2 = largest_power_of_two(p)
    buf = torch.empty_like(flat)
    new_rank = fold_in(p2p, flat, buf, op)
    mask, step = 1, 0
    while new_rank is not None and mask < p2:
        new_partner = new_rank ^ mask
        partner = group_rank(new_partner, p)
        p2p.at("exchange", step).exchange(flat, partner, buf, partner)
        # Both partners compute op(lower, higher): bit-identical results on both sides.
        combine_(flat, buf, op, other_first=new_partner < new_rank)
        mask, step = mask << 1, step + 1
    unfold(p2p, flat)
    finish_(flat, op, p)


@torch.no_grad()
def allreduce_recursive_doubling(
    tensor: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    *,
    check: bool = True,
) -> None:
    """All-reduce ``tensor`` in place by recursive doubling (pairwise exchange with r XOR 2^k).

    log2 p sends of n elements per rank for power-of-two p; otherwise the extra ranks fold
    into a partner first and receive the result at the end (Thakur, Rabenseifner and Gropp
    2005, §4), so most ranks send ⌊log2 p⌋ messages, the partners of folded ranks one more
    and the folded ranks one.

    Args:
        tensor: this rank's input; holds the reduction over the group afterwards.
        op: SUM, PRODUCT, MIN, MAX or AVG, as ``dist.ReduceOp.SUM``-like or a name.
        group: the process group (default: the default group).
        check: first check that every rank passes the same shape, dtype and op.

    Returns:
        None; ``tensor`` is modified in place, like ``dist.all_reduce``.

    Raises:
        ValueError: unsupported op, or inputs that differ across ranks (on every rank).
        TypeError: AVG of an integer tensor.
    """
    run_allreduce(tensor, op, group, check, _exchange_and_combine)
