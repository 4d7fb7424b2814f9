"""All-reduce as reduce-to-a-root then broadcast: the naive (flat) and binomial-tree versions.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

Both send whole tensors. Naive: the root receives p−1 tensors one after another and sends
p−1 back, so its time grows like 2(p−1)(α + nβ). Binomial tree: ⌈log2 p⌉ rounds each way,
2⌈log2 p⌉(α + nβ) (Thakur, Rabenseifner and Gropp 2005, §3–4: binomial broadcast, and
reduce as its mirror image). All ranks receive the root's bits, so every rank ends with
exactly the same result.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from labkit.collectives.counting import P2P
from labkit.collectives.expected import tree_children
from labkit.collectives.ops import combine_, finish_, flat_view, prepare, run_allreduce

__all__ = ["allreduce_naive", "allreduce_tree", "broadcast_tree", "reduce_tree"]

ReduceOp = dist.ReduceOp


def _gather_and_send_back(p2p: P2P, flat: torch.Tensor, op: str) -> None:
    """The naive all-reduce on a contiguous buffer: rank 0 reduces in rank order."""
    if p2p.rank == 0:
        buf = torch.empty_like(flat)
        for src in range(1, p2p.world_size):  # in rank order: a fixed reduction order
            p2p.at("gather", 0).recv(buf, src)
            combine_(flat, buf, op)
        finish_(flat, op, p2p.world_size)
        # One batch for the p−1 sends (NCCL coalesces it; see ``P2P.start``).
        sends = [(flat, d) for d in range(1, p2p.world_size)]
        for work in p2p.at("scatter back", 1).start(sends, []):
            work.wait()
    else:
        p2p.at("gather", 0).send(flat, 0)
        p2p.at("scatter back", 1).recv(flat, 0)


@torch.no_grad()
def allreduce_naive(
    tensor: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    *,
    check: bool = True,
) -> None:
    """All-reduce ``tensor`` in place: everyone sends to rank 0, which sends the result back.

    Rank 0 sends and receives p−1 messages of n elements; every other rank one of each.
    The "reduce + broadcast" baseline of Thakur, Rabenseifner and Gropp 2005, §4, with
    flat (linear) reduce and broadcast.

    Args:
        tensor: this rank's input; holds the reduction over the group afterwards.
        op: SUM, PRODUCT, MIN, MAX or AVG, as ``dist.ReduceOp.SUM``-like or a name.
        group: the process group (default: the default group); rank 0 means group rank 0.
        check: first check that every rank passes the same shape, dtype and op (one small
            all-gather); turn off only when timing the algorithm itself.

    Returns:
        None; ``tensor`` is modified in place, like ``dist.all_reduce``.

    Raises:
        ValueError: unsupported op, or inputs that differ across ranks (on every rank).
        TypeError: AVG of an integer tensor.
    """
    run_allreduce(tensor, op, group, check, _gather_and_send_back)


def _reduce_tree(p2p: P2P, flat: torch.Tensor, op: str, root: int) -> None:
    """Binomial-tree reduce of ``flat`` to group rank ``root`` (no AVG division)."""
    p = p2p.world_size
    vrank = (p2p.rank - root) % p  # rank relative to the root
    buf = torch.empty_like(flat)
    for child in tree_children(vrank, p):  # nearest child first: step k receives from r + 2^k
        p2p.at("reduce", (child - vrank).bit_length() - 1).recv(buf, (child + root) % p)
        combine_(flat, buf, op)  # parent (lower relative rank) first: a fixed order
    if vrank != 0:
        parent = vrank - (vrank & -vrank)  # clear the lowest set bit
        p2p.at("reduce", (vrank & -vrank).bit_length() - 1).send(flat, (parent + root) % p)


def _broadcast_tree(p2p: P2P, flat: torch.Tensor, root: int) -> None:
    """Binomial-tree broadcast of ``flat`` from group rank ``root``."""
    p = p2p.world_size
    vrank = (p2p.rank - root) % p
    rounds = (p - 1).bit_length()  # ⌈log2 p⌉
    if vrank != 0:
        low = vrank & -vrank  # received in the round that doubles the set of holders to 2·low
        p2p.at("broadcast", rounds - low.bit_length()).recv(flat, (vrank - low + root) % p)
    for child in reversed(tree_children(vrank, p)):  # farthest child first
        step = rounds - (child - vrank).bit_length()
        p2p.at("broadcast", step).send(flat, (child + root) % p)


def _reduce_and_broadcast(p2p: P2P, flat: torch.Tensor, op: str) -> None:
    """The tree all-reduce on a contiguous buffer, through rank 0."""
    _reduce_tree(p2p, flat, op, 0)
    if p2p.rank == 0:
        finish_(flat, op, p2p.world_size)
    _broadcast_tree(p2p, flat, 0)


@torch.no_grad()
def reduce_tree(
    tensor: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    *,
    root: int = 0,
    check: bool = True,
) -> None:
    """Reduce ``tensor`` to group rank ``root`` along a binomial tree.

    In round k a rank whose relative rank has lowest set bit 2^k sends its partial result to
    the rank 2^k below it; after ⌈log2 p⌉ rounds the root holds the reduction. Each non-root
    rank sends exactly one message. Thakur, Rabenseifner and Gropp 2005, §4 (reduce).

    Args:
        tensor: this rank's input; on ``root`` the reduction afterwards, on other ranks a
            partial result (like ``dist.reduce``, do not rely on it).
        op: SUM, PRODUCT, MIN, MAX or AVG.
        group: the process group (default: the default group).
        root: the group rank that receives the result.
        check: first check that every rank passes the same shape, dtype and op.

    Returns:
        None; ``tensor`` is modified in place.

    Raises:
        ValueError: unsupported op, bad root, or inputs that differ across ranks.
        TypeError: AVG of an integer tensor.
    """
    name = prepare(tensor, op, group, check)
    p2p = P2P(group)
    if not 0 <= root < p2p.world_size:
        raise ValueError(f"root {root} is not a rank of a group of {p2p.world_size}")
    with flat_view(tensor) as flat:
        _reduce_tree(p2p, flat, name, root)
        if p2p.rank == root:
            finish_(flat, name, p2p.world_size)


@torch.no_grad()
def broadcast_tree(
    tensor: torch.Tensor, group: dist.ProcessGroup | None = None, *, root: int = 0
) -> None:
    """Broadcast ``tensor`` from group rank ``root`` along a binomial tree.

    Round k doubles the ranks that hold the data: ranks with relative rank below 2^k send to
    the rank 2^k above them, ⌈log2 p⌉ rounds in all and p−1 messages. Thakur, Rabenseifner
    and Gropp 2005, §3 (binomial-tree broadcast).

    Args:
        tensor: the data on ``root``; the buffer to fill on the other ranks (same shape and
            dtype everywhere; not checked, the caller guarantees it).
        group: the process group (default: the default group).
        root: the group rank that holds the data.

    Returns:
        None; ``tensor`` is overwritten on every rank but ``root``.

    Raises:
        ValueError: ``root`` is not a rank of the group.
    """
    p2p = P2P(group)
    if not 0 <= root < p2p.world_size:
        raise ValueError(f"root {root} is not a rank of a group of {p2p.world_size}")
    with flat_view(tensor) as flat:
        _broadcast_tree(p2p, flat, root)


@torch.no_grad()
def allreduce_tree(
    tensor: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    *,
    check: bool = True,
) -> None:
    """All-reduce ``tensor`` in place: binomial-tree reduce to rank 0, then tree broadcast.

    2(p−1) messages of n elements in total, ⌈log2 p⌉ rounds each way, so time grows like
    2⌈log2 p⌉(α + nβ) (Thakur, Rabenseifner and Gropp 2005, §4).

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
    run_allreduce(tensor, op, group, check, _reduce_and_broadcast)
