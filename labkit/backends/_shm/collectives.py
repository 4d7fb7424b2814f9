"""Collective algorithms over the shared segment, chunk by chunk through fixed-size slots.

Introduced in notebooks/04_custom_backend.ipynb.

Every function takes 1-D contiguous tensors and runs rounds (see ``sync.py``): write into this
rank's slot, ``arrive`` (the first round also carries the descriptor that every rank checks),
read the peers' slots, ``next_round``. A tensor larger than a slot streams through in chunks.

all_reduce lives in ``allreduce.py`` (one-shot, or reduce-scatter + all-gather, pipelined);
``reduce`` uses the same reduce-scatter, then gathers onto the root.

Reference: Thakur, Rabenseifner and Gropp 2005, §4 (reduce-scatter + all-gather); Graham and
Shipman, "MPI Support for Multi-core Architectures" (EuroPVM/MPI 2008): shared-memory
collectives with per-rank buffers and flags; the one-shot / two-shot split is that of the
custom all-reduce kernels in TensorRT-LLM and vLLM.
"""

from __future__ import annotations

import torch

from labkit.backends._pg_util import reduce_into_row, reduce_rows
from labkit.backends._shm.describe import OpDesc, check_descriptors

# Up to this many bytes each rank reduces the whole chunk itself: one round trip instead of
# two. Above it all_reduce splits the work (reduce-scatter + all-gather, pipelined) on any
# number of ranks: on 2 and 3 ranks of a 2-core machine, fastest of 11 calls, one-shot took
# 1.1-1.6x the time of the split from 512 KiB to 16 MiB (2 ranks: 2.53 against 2.06 ms at
# 16 MiB; benchmarks/RESULTS.md) — a rank copies into shared memory only the pieces its peers
# reduce, and chunk k's reduce-scatter shares a round with chunk k-1's all-gather.
# LABKIT_SHM_ONE_SHOT_BYTES overrides the size (0: always split, whatever the world size).
ONE_SHOT_BYTES = 256 << 10
# reduce (to one root) stays one-shot up to this many ranks at any size: there only the root
# reduces, and splitting added a round that cost more (2 ranks: 0.84-0.86x from 512 KiB).
ONE_SHOT_RANKS = 3


class Exchange:
    """The slots of the current round and its ``arrive``, for one group."""

    def __init__(self, seg, rounds, one_shot_bytes: int) -> None:
        self.seg = seg
        self.one_shot_bytes = one_shot_bytes
        self.rounds = rounds
        self.rank = rounds.rank
        self.n = rounds.n
        self.label = ""
        self.views: dict = {}  # (dtype, chunk length) -> SlotViews (see allreduce.py)

    def one_shot(self, flat: torch.Tensor, up_to_ranks: int = 1) -> bool:
        """Whether to reduce whole chunks (vs reduce-scatter + all-gather): small tensors, or
        at most ``up_to_ranks`` ranks whatever the size."""
        if self.n == 1 or self.one_shot_bytes <= 0:
            return self.n == 1
        return self.n <= up_to_ranks or flat.numel() * flat.element_size() <= self.one_shot_bytes

    def rows(self, dtype: torch.dtype) -> torch.Tensor:
        """Every rank's slot in this round's buffer: [n, capacity] of ``dtype``."""
        return self.seg.slots(dtype)[:, self.rounds.buf]

    def arrive(self, desc: OpDesc | None = None) -> list[OpDesc] | None:
        """Signal and wait for every rank; with ``desc``, check every rank's descriptor."""
        if desc is None:
            self.rounds.arrive(self.label)
            return None
        buf, mine = self.rounds.buf, desc.encode()
        self.seg.write_desc(self.rank, buf, mine)
        self.rounds.arrive(self.label)
        raw = [self.seg.read_desc(r, buf) for r in range(self.n)]
        if not desc.error and all(d == mine for d in raw):  # the usual case: nothing to decode
            return [desc] * self.n
        descs = [OpDesc.decode(d) for d in raw]
        check_descriptors(descs)
        return descs

    def next_round(self) -> None:
        self.rounds.next_round()


def _chunks(total: int, cap: int):
    """(start, end) of each chunk; at least one (possibly empty) so every rank has a round."""
    yield 0, min(total, cap)
    for k0 in range(cap, total, cap):
        yield k0, min(total, k0 + cap)


def _align(dtype: torch.dtype) -> int:
    return max(1, 64 // dtype.itemsize)


def _per_rank(cap: int, n: int, dtype: torch.dtype) -> int:
    """Elements per destination when a slot is cut into n parts (64-byte aligned)."""
    a = _align(dtype)
    return max(1, cap // n // a * a) if cap // n >= a else max(1, cap // n)


def pieces(m: int, n: int, align: int) -> list[tuple[int, int]]:
    """Cut ``m`` elements into ``n`` contiguous pieces whose starts are multiples of ``align``."""
    units = -(-m // align)
    base, extra = divmod(units, n)
    out, start = [], 0
    for r in range(n):
        end = start + (base + (r < extra)) * align
        out.append((min(start, m), min(end, m)))
        start = end
    return out


def reduce(ex: Exchange, flat: torch.Tensor, op: str, root: int, desc: OpDesc) -> None:
    """Reduce ``flat`` onto ``root`` (reduce-scatter, then the root gathers the pieces)."""
    n, me, dtype = ex.n, ex.rank, flat.dtype
    cap = ex.rows(dtype).shape[1]
    one_shot = ex.one_shot(flat, ONE_SHOT_RANKS)
    for k0, k1 in _chunks(flat.numel(), cap):
        rows = ex.rows(dtype)[:, : k1 - k0]
        rows[me].copy_(flat[k0:k1])
        ex.arrive(desc)
        desc = None
        if one_shot:
            if me == root:
                reduce_rows(rows, op, flat[k0:k1])
        else:
            bounds = pieces(k1 - k0, n, _align(dtype))
            lo, hi = bounds[me]
            reduce_into_row(rows[:, lo:hi], me, op)
            ex.arrive()
            if me == root:
                for r, (lo, hi) in enumerate(bounds):
                    flat[k0 + lo : k0 + hi].copy_(rows[r, lo:hi])
        ex.next_round()


def broadcast(ex: Exchange, flat: torch.Tensor, root: int, desc: OpDesc) -> None:
    """Copy ``root``'s ``flat`` into every rank's ``flat``."""
    cap = ex.rows(flat.dtype).shape[1]
    for k0, k1 in _chunks(flat.numel(), cap):
        rows = ex.rows(flat.dtype)
        if ex.rank == root:
            rows[root, : k1 - k0].copy_(flat[k0:k1])
        ex.arrive(desc)
        desc = None
        if ex.rank != root:
            flat[k0:k1].copy_(rows[root, : k1 - k0])
        ex.next_round()


def all_gather(ex: Exchange, inp: torch.Tensor, outs, desc: OpDesc) -> None:
    """``outs[r]`` (1-D, like ``inp``) receives rank r's ``inp`` on every rank."""
    cap = ex.rows(inp.dtype).shape[1]
    for k0, k1 in _chunks(inp.numel(), cap):
        rows = ex.rows(inp.dtype)[:, : k1 - k0]
        rows[ex.rank].copy_(inp[k0:k1])
        ex.arrive(desc)
        desc = None
        for r in range(ex.n):
            outs[r][k0:k1].copy_(rows[r])
        ex.next_round()


def gather(ex: Exchange, inp: torch.Tensor, outs, root: int, desc: OpDesc) -> None:
    """On ``root``, ``outs[r]`` receives rank r's ``inp``; other ranks pass ``outs=None``."""
    cap = ex.rows(inp.dtype).shape[1]
    for k0, k1 in _chunks(inp.numel(), cap):
        rows = ex.rows(inp.dtype)[:, : k1 - k0]
        rows[ex.rank].copy_(inp[k0:k1])
        ex.arrive(desc)
        desc = None
        if ex.rank == root:
            for r in range(ex.n):
                outs[r][k0:k1].copy_(rows[r])
        ex.next_round()


def scatter(ex: Exchange, ins, out: torch.Tensor, root: int, desc: OpDesc) -> None:
    """Rank r's ``out`` receives ``ins[r]`` from ``root``; other ranks pass ``ins=None``."""
    n, me, dtype = ex.n, ex.rank, out.dtype
    per = _per_rank(ex.rows(dtype).shape[1], n, dtype)
    for k0, k1 in _chunks(out.numel(), per):
        c = k1 - k0
        src = ex.rows(dtype)[root, : n * per].view(n, per)[:, :c]
        if me == root:
            for j in range(n):
                src[j].copy_(ins[j][k0:k1])
        ex.arrive(desc)
        desc = None
        out[k0:k1].copy_(src[me])
        ex.next_round()


def reduce_scatter(ex: Exchange, ins, out: torch.Tensor, op: str, desc: OpDesc) -> None:
    """Rank r's ``out`` receives the reduction over ranks of their ``ins[r]``."""
    n, me, dtype = ex.n, ex.rank, out.dtype
    per = _per_rank(ex.rows(dtype).shape[1], n, dtype)
    for k0, k1 in _chunks(out.numel(), per):
        c = k1 - k0
        rows = ex.rows(dtype)[:, : n * per].view(n, n, per)  # [rank, destination, element]
        for j in range(n):
            rows[me, j, :c].copy_(ins[j][k0:k1])
        ex.arrive(desc)
        desc = None
        reduce_rows(rows[:, me, :c], op, out[k0:k1])
        ex.next_round()


def all_to_all(ex: Exchange, sends, recvs, desc: OpDesc, item_bytes: int = 1) -> None:
    """Rank i's ``sends[j]`` lands in rank j's ``recvs[i]`` (sizes may differ per pair).

    ``desc.sends`` counts elements of ``item_bytes`` bytes; ``sends``/``recvs`` may be bytes.
    """
    n, me = ex.n, ex.rank
    dtype = sends[0].dtype
    per = _per_rank(ex.rows(dtype).shape[1], n, dtype)
    total_rounds, t = 1, 0
    while t < total_rounds:
        k0 = t * per
        rows = ex.rows(dtype)[:, : n * per].view(n, n, per)  # [rank, destination, element]
        for j in range(n):
            c = min(per, sends[j].numel() - k0)
            if c > 0:
                rows[me, j, :c].copy_(sends[j][k0 : k0 + c])
        descs = ex.arrive(desc if t == 0 else None)
        if descs is not None:  # every rank now knows every size: same number of rounds
            longest = max((s for d in descs for s in d.sends), default=0) * item_bytes
            total_rounds = max(1, -(-longest // per))
        for i in range(n):
            c = min(per, recvs[i].numel() - k0)
            if c > 0:
                recvs[i][k0 : k0 + c].copy_(rows[i, me, :c])
        ex.next_round()
        t += 1


def barrier(ex: Exchange, desc: OpDesc) -> None:
    """Return once every rank has entered the barrier."""
    ex.arrive(desc)
    ex.next_round()
