"""What one call of a collective does on each rank, backend by backend: the work behind its time.

Introduced in notebooks/05_communication_cost.ipynb.

The α-β formulas (``formulas``) describe an algorithm on an ideal network. A real backend on one
host also copies buffers, reduces, waits for its peers once per round, and pays a fixed cost
per call. A ``Recipe`` counts that work per byte of n (nccl-tests' size, as in ``formulas``),
read from the implementation; ``labkit.costmodel.machine`` prices it with this machine's
calibrated rates.

- **gloo** (torch 2.13's ``ProcessGroupGloo`` on gloo): ``all_reduce`` is gloo's ring
  (reduce-scatter, then all-gather, over the pairs' sockets: 2(p−1)/p·n sent *and* received
  by each rank at once, (p−1)/p·n reduced), cut into S segments of at most 1 MiB, S a
  multiple of p and at least 2p (``gloo/allreduce.cc``, ``kMaxSegmentSize``), so each rank
  sends 2(S − S/p) messages where the textbook ring sends 2(p−1) — and a call of one float,
  whose other segments are empty, sends those 2(p−1): the difference is ``messages``;
  ``all_gather_into_tensor`` is gloo's ring all-gather ((p−1)/p·n both ways, 2(p−1) halves of
  blocks whatever the size: ``gloo/allgather.cc``) into a flat buffer that torch then copies
  into the output (n), gloo having copied the rank's own block in first (n/p);
  ``reduce_scatter_tensor`` clones the input (n), all-reduces the whole clone, and copies this
  rank's block out (n/p) (``ProcessGroupGloo::reduce_scatter_tensor_coalesced``);
  ``broadcast`` is gloo's binomial tree, ⌈lg p⌉ one-way hops of n (``gloo/broadcast.cc``).
- **labkit_shm** (``labkit/backends/_shm``): data moves through per-rank slots of shared
  memory, a slot (``chunk_bytes``) per round, and each round ends when every rank has
  arrived. ``all_reduce`` up to 256 KiB is one-shot: copy n into the slot,
  reduce all p slots (p − 1 passes over n); otherwise reduce-scatter + all-gather, pipelined
  (copy (p−1)/p·n in, reduce its piece: (p−1)/p·n, copy it back, n/p, copy (p−1)/p·n out; one
  round more than the chunks). ``all_gather``: copy n/p in, n out. ``reduce_scatter``: copy
  n in (a block per destination), reduce (p−1)/p·n. ``broadcast``: the root copies n in,
  every other rank n out, chunk by chunk. What a rank reads from its peers' slots (``cross``):
  one-shot (p−1)·n, the split all-reduce 2(p−1)/p·n (its piece's peers' parts, then the peers'
  reduced pieces), all-gather and reduce-scatter (p−1)/p·n, broadcast n.

Pure arithmetic, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "GLOO_SEGMENT_BYTES",
    "KINDS",
    "OPS",
    "SHM_ONE_SHOT_BYTES",
    "Recipe",
    "gloo_ring_messages",
    "lg_ceil",
    "recipe",
]

KINDS = ("gloo", "labkit_shm")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")  # those with recipes
# labkit_shm's one-shot all-reduce (labkit/backends/_shm/collectives.py: ONE_SHOT_BYTES; a
# test keeps the two in step).
SHM_ONE_SHOT_BYTES = 256 << 10


def lg_ceil(p: int) -> int:
    """⌈log2 p⌉ (0 for p = 1)."""
    return (p - 1).bit_length()


@dataclass(frozen=True)
class Recipe:
    """The work of one call on the busiest rank, per byte of n.

    Attributes:
        wire: bytes through the transport on the critical path (β each).
        exchange: those bytes are sent and received at the same time (the duplex factor
            applies: an exchange of m bytes each way takes ``duplex`` × a one-way m).
        copy: bytes copied by the rank itself (memcpy rate).
        reduce: bytes reduced (γ each: one pass of ``a += b`` over them).
        chunked: bytes that stream through slots of ``chunk_bytes``, one round each.
        cross: bytes read from slots a peer has just written (each line from the peer's
            cache: the hand-off's price per byte on top of the copy or reduction).
        extra_rounds: rounds beyond the chunks (labkit_shm's pipelined all-reduce: 1).
        messages: point-to-point messages on the critical path beyond those of the
            smallest call (which the measured per-call cost covers), α each: not per byte.
        source: where in the implementation this comes from.
    """

    wire: float = 0.0
    exchange: bool = False
    copy: float = 0.0
    reduce: float = 0.0
    chunked: float = 0.0
    cross: float = 0.0
    extra_rounds: int = 0
    messages: float = 0.0
    source: str = ""

    def rounds(self, n_bytes: float, chunk_bytes: float) -> int:
        """Rounds of a call of ``n_bytes`` (at least one)."""
        if not self.chunked or chunk_bytes <= 0:
            return 1 + self.extra_rounds
        return max(1, math.ceil(self.chunked * n_bytes / chunk_bytes)) + self.extra_rounds


GLOO_SEGMENT_BYTES = 1 << 20  # gloo's AllreduceOptionsImpl::kMaxSegmentSize


def gloo_ring_messages(n_bytes: float, p: int) -> int:
    """Messages each rank sends in gloo's ring all-reduce of ``n_bytes`` on ``p`` ranks:
    2(S − S/p) for S = ⌈max(⌈n / 1 MiB⌉, 2p) / p⌉·p segments (``gloo/allreduce.cc``)."""
    s = max(math.ceil(n_bytes / GLOO_SEGMENT_BYTES), 2 * p)
    s = math.ceil(s / p) * p
    return 2 * (s - s // p)


def _gloo(op: str, p: int, n_bytes: float = 0.0) -> Recipe:
    f = (p - 1) / p
    more = gloo_ring_messages(n_bytes, p) - 2 * (p - 1)  # beyond a one-float call's
    if op == "all_reduce":
        return Recipe(
            wire=2 * f, exchange=True, reduce=f, messages=more, source="gloo ring all-reduce"
        )
    if op == "all_gather":
        return Recipe(
            wire=f, exchange=True, copy=1 + 1 / p, source="gloo ring all-gather + torch's copy"
        )
    if op == "reduce_scatter":
        return Recipe(
            wire=2 * f,
            exchange=True,
            reduce=f,
            copy=1 + 1 / p,
            messages=more,
            source="torch's clone + gloo ring all-reduce + copy out",
        )
    if op == "broadcast":
        return Recipe(wire=lg_ceil(p), source="gloo binomial-tree broadcast")
    raise ValueError(f"no gloo recipe for {op!r}; known: all_reduce, all_gather, ...")


def _shm(op: str, p: int, n_bytes: float) -> Recipe:
    f = (p - 1) / p
    if op == "all_reduce":
        if n_bytes <= SHM_ONE_SHOT_BYTES:
            return Recipe(
                copy=1, reduce=p - 1, chunked=1, cross=p - 1, source="labkit_shm one-shot"
            )
        return Recipe(
            copy=2 * f + 1 / p,
            reduce=f,
            chunked=1,
            cross=2 * f,
            extra_rounds=1,
            source="labkit_shm reduce-scatter + all-gather, pipelined",
        )
    if op == "all_gather":
        return Recipe(copy=1 + 1 / p, chunked=1 / p, cross=f, source="labkit_shm all-gather")
    if op == "reduce_scatter":
        return Recipe(copy=1, reduce=f, chunked=1, cross=f, source="labkit_shm reduce-scatter")
    if op == "broadcast":
        return Recipe(copy=1, chunked=1, cross=1, source="labkit_shm broadcast")
    raise ValueError(f"no labkit_shm recipe for {op!r}; known: all_reduce, all_gather, ...")


def recipe(kind: str, op: str, world_size: int, n_bytes: float = 0.0) -> Recipe:
    """The work of one ``op`` of ``n_bytes`` on ``world_size`` ranks of backend ``kind``.

    Args:
        kind: ``"gloo"`` or ``"labkit_shm"``.
        op: ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"`` or ``"broadcast"``.
        world_size: ranks p (≥ 2).
        n_bytes: the size (labkit_shm's all-reduce picks its algorithm by it; gloo's ring
            cuts it into segments).

    Returns:
        The ``Recipe``.

    Raises:
        ValueError: an unknown kind or op, or ``world_size < 2``.
    """
    if world_size < 2:
        raise ValueError(f"a recipe needs world_size >= 2, got {world_size}")
    if kind == "gloo":
        return _gloo(op, world_size, n_bytes)
    if kind == "labkit_shm":
        return _shm(op, world_size, n_bytes)
    raise ValueError(f"unknown backend kind {kind!r}; known: {', '.join(KINDS)}")
