"""Folding p ranks onto a power of two, for the algorithms that need p = 2^k.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

MPICH's scheme (Thakur, Rabenseifner and Gropp 2005, §4; MPICH's
``allreduce_intra_recursive_doubling.c`` and ``allreduce_intra_reduce_scatter_allgather.c``):
with p' = 2^⌊log2 p⌋ and rem = p − p', among the first 2·rem ranks every even rank sends its
whole tensor to the odd rank above it and sits out; the p' ranks left (every odd rank below
2·rem and every rank from 2·rem up) run the power-of-two algorithm under new ranks 0 … p'−1;
then each odd rank below 2·rem sends the result back to its even partner. That costs one
extra message of n elements before and one after: α + nβ (+ nγ for the reduction) each.
"""

from __future__ import annotations

import torch

from labkit.collectives.counting import P2P
from labkit.collectives.expected import largest_power_of_two
from labkit.collectives.ops import combine_

__all__ = ["fold_in", "group_rank", "unfold"]


def group_rank(new_rank: int, world_size: int) -> int:
    """The group rank of the rank numbered ``new_rank`` among the p' that take part.

    Args:
        new_rank: a rank in ``range(p')``.
        world_size: p.

    Returns:
        ``2·new_rank + 1`` for the first rem new ranks (the odd partners), else
        ``new_rank + rem``.

    Raises:
        Nothing of its own.
    """
    rem = world_size - largest_power_of_two(world_size)
    return 2 * new_rank + 1 if new_rank < rem else new_rank + rem


def fold_in(p2p: P2P, flat: torch.Tensor, buf: torch.Tensor, op: str) -> int | None:
    """The fold step: even ranks below 2·rem hand their tensor to the odd rank above them.

    Args:
        p2p: this rank's ``P2P``.
        flat: this rank's 1-D buffer; on a partner it then holds op(partner's, own).
        buf: scratch space of ``flat``'s size.
        op: one of ``labkit.collectives.OPS``.

    Returns:
        This rank's new rank among the p' ranks that go on, or None when it sat out (it
        must then call ``unfold`` to receive the result).

    Raises:
        RuntimeError: from ``torch.distributed`` when a message fails.
    """
    p, r = p2p.world_size, p2p.rank
    rem = p - largest_power_of_two(p)
    if r < 2 * rem and r % 2 == 0:
        p2p.at("fold", 0).send(flat, r + 1)
        return None
    if r < 2 * rem:
        p2p.at("fold", 0).recv(buf, r - 1)
        combine_(flat, buf, op, other_first=True)  # the lower rank's values first
        return r // 2
    return r - rem


def unfold(p2p: P2P, flat: torch.Tensor) -> None:
    """The unfold step: each odd rank below 2·rem sends the result to its even partner.

    Args:
        p2p: this rank's ``P2P``.
        flat: the result on the partners; filled in place on the ranks that sat out.

    Returns:
        None.

    Raises:
        RuntimeError: from ``torch.distributed`` when a message fails.
    """
    p, r = p2p.world_size, p2p.rank
    rem = p - largest_power_of_two(p)
    if r < 2 * rem and r % 2 == 0:
        p2p.at("unfold", 0).recv(flat, r + 1)
    elif r < 2 * rem:
        p2p.at("unfold", 0).send(flat, r - 1)
