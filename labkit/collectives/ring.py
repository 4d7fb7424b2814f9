"""Ring all-reduce: a reduce-scatter around the ring, then an all-gather around the ring.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

The tensor is cut into p chunks (``chunk_bounds``; sizes may differ by one, and may be 0).
Each step every rank sends one chunk to its right neighbour and receives one from its left,
so all links are busy at once and no rank sends more than about 2(p−1)/p · n elements in
total: 2(p−1)α + 2(p−1)/p · nβ, bandwidth-optimal for large messages (Thakur, Rabenseifner
and Gropp 2005, §4; Patarasuk and Yuan 2009). Each chunk is reduced by one rank and copied to
the others, so every rank ends with exactly the same bits.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from labkit.collectives.counting import P2P
from labkit.collectives.expected import chunk_bounds
from labkit.collectives.ops import combine_, finish_, flat_view, prepare, run_allreduce

__all__ = ["all_gather_ring", "allreduce_ring", "allreduce_ring_flat", "reduce_scatter_ring"]

ReduceOp = dist.ReduceOp


def _chunks(flat: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    return [flat[a:b] for a, b in chunk_bounds(flat.numel(), world_size)]


def _reduce_scatter(p2p: P2P, flat: torch.Tensor, op: str) -> torch.Tensor:
    """Ring reduce-scatter of ``flat`` in place; returns the chunk this rank now owns."""
    p, r = p2p.world_size, p2p.rank
    chunks = _chunks(flat, p)
    right, left = (r + 1) % p, (r - 1) % p
    buf = torch.empty(max(c.numel() for c in chunks), dtype=flat.dtype, device=flat.device)
    for step in range(p - 1):
        # Send the chunk reduced in the previous step; after p−1 steps chunk r has passed
        # through every rank and lands, fully reduced, back on rank r.
        send, recv = chunks[(r - step - 1) % p], chunks[(r - step - 2) % p]
        incoming = buf[: recv.numel()]
        p2p.at("reduce-scatter", step).exchange(send, right, incoming, left)
        combine_(recv, incoming, op)
    return chunks[r]


def _all_gather(p2p: P2P, flat: torch.Tensor) -> None:
    """Ring all-gather in place: chunk r of rank r travels once around the ring."""
    p, r = p2p.world_size, p2p.rank
    chunks = _chunks(flat, p)
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        # Forward what arrived in the previous step (own chunk first), straight into place.
        send, recv = chunks[(r - step) % p], chunks[(r - step - 1) % p]
        p2p.at("all-gather", step).exchange(send, right, recv, left)


def allreduce_ring_flat(p2p: P2P, flat: torch.Tensor, op: str) -> None:
    """The ring all-reduce of a contiguous 1-D buffer, sending through ``p2p``.

    The body of ``allreduce_ring`` without its checks, for a ``P2P`` of one's own
    (``labkit.collectives.ring_trace`` runs it on threads).

    Args:
        p2p: this rank's sends and receives (``world_size``, ``rank``, ``at``).
        flat: this rank's contiguous 1-D input; holds the reduction afterwards.
        op: the op's name, one of ``OPS``.

    Returns:
        None; ``flat`` is modified in place.
    """
    mine = _reduce_scatter(p2p, flat, op)
    finish_(mine, op, p2p.world_size)  # divide n/p elements, not n
    _all_gather(p2p, flat)


@torch.no_grad()
def reduce_scatter_ring(
    tensor: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    *,
    check: bool = True,
) -> torch.Tensor:
    """Ring reduce-scatter in place: rank r ends with the reduction of chunk r.

    p−1 steps; in step s rank r sends chunk (r−s−1) mod p to rank r+1 and adds the chunk
    (r−s−2) mod p that rank r−1 sends into its own copy. Thakur, Rabenseifner and Gropp
    2005, §4 (the first half of the ring all-reduce).

    Args:
        tensor: this rank's full input, split into chunks by ``chunk_bounds(numel, p)``.
        op: SUM, PRODUCT, MIN, MAX or AVG.
        group: the process group (default: the default group).
        check: first check that every rank passes the same shape, dtype and op.

    Returns:
        The view of ``tensor`` (flattened) that holds chunk r, fully reduced. The other chunks
        hold partial results.

    Raises:
        ValueError: unsupported op, non-contiguous tensor, or inputs that differ across ranks.
        TypeError: AVG of an integer tensor.
    """
    name = prepare(tensor, op, group, check)
    if not tensor.is_contiguous():
        raise ValueError("reduce_scatter_ring returns a view: pass a contiguous tensor")
    p2p = P2P(group)
    mine = _reduce_scatter(p2p, tensor.view(-1), name)
    finish_(mine, name, p2p.world_size)
    return mine


@torch.no_grad()
def all_gather_ring(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
    """Ring all-gather in place: on entry rank r's chunk r is valid, on exit every chunk is.

    p−1 steps; in step s rank r sends chunk (r−s) mod p to rank r+1 and receives chunk
    (r−s−1) mod p from rank r−1, forwarding what it received in the previous step. Thakur,
    Rabenseifner and Gropp 2005, §3 (ring all-gather).

    Args:
        tensor: the full-size buffer, split into chunks by ``chunk_bounds(numel, p)``; same
            shape and dtype on every rank (not checked, the caller guarantees it).
        group: the process group (default: the default group).

    Returns:
        None; ``tensor`` is filled in place.

    Raises:
        RuntimeError: from ``torch.distributed`` when the group is not initialised.
    """
    p2p = P2P(group)
    with flat_view(tensor) as flat:
        _all_gather(p2p, flat)


@torch.no_grad()
def allreduce_ring(
    tensor: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    *,
    check: bool = True,
) -> None:
    """All-reduce ``tensor`` in place around a ring: reduce-scatter, then all-gather.

    2(p−1) sends per rank of one chunk (about n/p elements) each, 2(p−1)/p · n elements per
    rank in all, whatever p (Thakur, Rabenseifner and Gropp 2005, §4). Works for any size,
    including sizes not divisible by p and smaller than p (some chunks are then empty).

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
    run_allreduce(tensor, op, group, check, allreduce_ring_flat)
