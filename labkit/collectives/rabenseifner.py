"""Rabenseifner's all-reduce: reduce-scatter by recursive halving, all-gather by doubling.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 19(1), 2005, §4 (Rabenseifner's algorithm, MPICH's choice for long messages
with a predefined op). On p = 2^k ranks the tensor is cut into p chunks (``chunk_bounds``):

- **reduce-scatter by recursive halving**: in step s (s = 0 … k−1) rank r pairs with
  r XOR p/2^(s+1); of the chunks both still work on, each keeps the half on its side of that
  bit, sends the other half to its partner and reduces the half it receives into its own.
  After k steps rank r holds chunk r, fully reduced; it sent n/2 + n/4 + … + n/p elements.
- **all-gather by recursive doubling**: in step s rank r pairs with r XOR 2^s and the two
  swap the 2^s chunks each holds, so the block of finished chunks doubles every step.

2·log2 p messages per rank and 2(p−1)/p · n elements (as the ring, in log2 p instead of p−1
steps per phase): 2 log2 p · α + 2(p−1)/p · nβ + (p−1)/p · nγ. For p not a power of two
the ranks first fold onto p' = 2^⌊log2 p⌋ (``labkit.collectives.fold``, MPICH's scheme),
which adds one message of n elements before and one after on the ranks involved.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from labkit.collectives.counting import P2P
from labkit.collectives.expected import (
    chunk_bounds,
    halving_doubling_windows,
    largest_power_of_two,
)
from labkit.collectives.fold import fold_in, group_rank, unfold
from labkit.collectives.ops import combine_, finish_, run_allreduce

__all__ = ["allreduce_rabenseifner"]

ReduceOp = dist.ReduceOp


def _span(bounds: list[tuple[int, int]], chunks: tuple[int, int]) -> slice:
    return slice(bounds[chunks[0]][0], bounds[chunks[1] - 1][1])


def _halve_and_double(p2p: P2P, flat: torch.Tensor, op: str) -> None:
    """The whole algorithm on a contiguous buffer."""
    p = p2p.world_size
    p2 = largest_power_of_two(p)
    buf = torch.empty_like(flat)
    new_rank = fold_in(p2p, flat, buf, op)
    if new_rank is not None:
        bounds = chunk_bounds(flat.numel(), p2)  # p' chunks: one per rank that takes part
        counters = {"reduce-scatter": 0, "all-gather": 0}
        for phase, new_partner, sent, received in halving_doubling_windows(new_rank, p2):
            send, recv = flat[_span(bounds, sent)], flat[_span(bounds, received)]
            partner = group_rank(new_partner, p)
            step = counters[phase]
            counters[phase] += 1
            if phase == "reduce-scatter":
                incoming = buf[: recv.numel()]
                p2p.at(phase, step).exchange(send, partner, incoming, partner)
                combine_(recv, incoming, op, other_first=new_partner < new_rank)
            else:  # straight into place
                p2p.at(phase, step).exchange(send, partner, recv, partner)
    unfold(p2p, flat)
    finish_(flat, op, p)


@torch.no_grad()
def allreduce_rabenseifner(
    tensor: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    *,
    check: bool = True,
) -> None:
    """All-reduce ``tensor`` in place: recursive-halving reduce-scatter, doubling all-gather.

    2·log2 p sends per rank and 2(p−1)/p · n elements for a power-of-two p (Thakur,
    Rabenseifner and Gropp 2005, §4); for other p the extra ranks fold into a partner first
    and get the result back at the end, so those partners send 2⌊log2 p⌋ + 1 messages and
    the folded ranks one. Works for any size, including sizes smaller than p (empty chunks).

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
    run_allreduce(tensor, op, group, check, _halve_and_double)
