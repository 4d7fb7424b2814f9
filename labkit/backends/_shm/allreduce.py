"""all_reduce over the shared slots: one-shot, or reduce-scatter + all-gather, pipelined.

Introduced in notebooks/04_custom_backend.ipynb.

Every rank copies its chunk into its slot (only the pieces its peers reduce, on the second
path); then either every rank reduces all slots itself ("one-shot": one round per chunk; for
tensors up to ``ONE_SHOT_BYTES``), or rank r reduces piece r of every slot into its own slot
(reduce-scatter) and everyone copies the reduced pieces out (all-gather), so a rank reads
about 3x the chunk instead of n x. The second path is
pipelined: chunk k's reduce-scatter and chunk k-1's all-gather share a round. Either way every
element is reduced by one code path in one order, so all ranks hold bit-identical results.

Per round each rank passes over its chunk about three times: into its slot, through the
reduction (its piece), out of the peers' slots. What remains is Python: a round issues a
dozen small torch calls, so the views of the slots that a chunk length needs are cut once
and cached (``SlotViews``), and empty copies are skipped.

Reference: Thakur, Rabenseifner and Gropp 2005, §4 (reduce-scatter + all-gather); Graham and
Shipman, "MPI Support for Multi-core Architectures" (EuroPVM/MPI 2008): shared-memory
collectives with per-rank buffers and flags; the one-shot / two-shot split is that of the
custom all-reduce kernels in TensorRT-LLM and vLLM.
"""

from __future__ import annotations

import torch

from labkit.backends._pg_util import reduce_rows
from labkit.backends._shm.collectives import Exchange, _align, _chunks, pieces
from labkit.backends._shm.describe import OpDesc
from labkit.backends._shm.layout import NBUF

MAX_CACHED = 64  # chunk lengths whose views a group keeps (DDP uses a handful of sizes)


class SlotViews:
    """The slots cut for chunks of ``m`` elements: rows and pieces, per buffer and rank.

    ``row[b][r]`` is rank r's slot in buffer b (``m`` elements), ``piece[b][r][j]`` its piece
    j (``bounds[j]``); ``before[b]`` / ``after[b]`` are this rank's slot around its own piece.
    """

    def __init__(self, slots: torch.Tensor, me: int, m: int) -> None:
        n = slots.shape[0]
        self.bounds = pieces(m, n, _align(slots.dtype))
        lo, hi = self.bounds[me]
        self.row = [[slots[r, b, :m] for r in range(n)] for b in range(NBUF)]
        self.piece = [[[row[a:z] for a, z in self.bounds] for row in rows] for rows in self.row]
        self.before = [rows[me][:lo] for rows in self.row]
        self.after = [rows[me][hi:] for rows in self.row]


def slot_views(ex: Exchange, dtype: torch.dtype, m: int) -> SlotViews:
    """The cached ``SlotViews`` of ``ex``'s segment for ``dtype`` and chunk length ``m``."""
    key = (dtype, m)
    views = ex.views.get(key)
    if views is None:
        if len(ex.views) >= MAX_CACHED:
            ex.views.clear()
        views = ex.views[key] = SlotViews(ex.seg.slots(dtype), ex.rank, m)
    return views


def all_reduce(ex: Exchange, flat: torch.Tensor, op: str, desc: OpDesc) -> None:
    """Reduce ``flat`` across ranks in place (one-shot or reduce-scatter + all-gather).

    Args:
        ex: the group's exchange (slots, rounds).
        flat: this rank's 1-D contiguous tensor; receives the result.
        op: a reduction name from ``reduce_op_name``.
        desc: the call's descriptor, checked against every rank's in the first round.

    Raises:
        MismatchError / ArgumentError: the ranks' calls differ or are invalid (every rank).
        GroupFailure: a peer died, left or timed out.
    """
    n, me, dtype = ex.n, ex.rank, flat.dtype
    cap = ex.seg.slots(dtype).shape[2]
    if ex.one_shot(flat):
        for k0, k1 in _chunks(flat.numel(), cap):
            rows = slot_views(ex, dtype, k1 - k0).row[ex.rounds.buf]
            dst = flat[k0:k1]
            rows[me].copy_(dst)
            ex.arrive(desc)
            desc = None
            reduce_rows(rows, op, dst)  # every rank, same rows, same order
            ex.next_round()
        return
    # Reduce-scatter + all-gather, pipelined: one arrival per chunk serves twice. After it,
    # chunk k is in every slot (this rank reduces its piece of it, in its own slot) and
    # chunk k-1's pieces are reduced (this rank copies them out). Three buffers keep chunk
    # k-1 intact while a fast rank already writes chunk k+1.
    # A rank's own piece never needs to be in shared memory: it reads it from ``flat``.
    pending = None  # (start, views, buffer) of the chunk reduced but not copied out
    for k0, k1 in _chunks(flat.numel(), cap):
        v, b = slot_views(ex, dtype, k1 - k0), ex.rounds.buf
        lo, hi = v.bounds[me]
        if lo:  # the pieces the peers reduce
            v.before[b].copy_(flat[k0 : k0 + lo])
        if k0 + hi < k1:
            v.after[b].copy_(flat[k0 + hi : k1])
        ex.arrive(desc)
        desc = None
        if pending is not None:
            _copy_out(flat, me, *pending)
        mine, out = flat[k0 + lo : k0 + hi], v.piece[b][me][me]
        sources = [mine if r == me else v.piece[b][r][me] for r in range(n)]
        reduce_rows(sources, op, out)  # into this rank's slot, for the peers
        mine.copy_(out)
        pending = (k0, v, b)
        ex.next_round()
    ex.arrive()  # every rank has reduced its piece of the last chunk
    _copy_out(flat, me, *pending)
    ex.next_round()


def _copy_out(flat: torch.Tensor, me: int, k0: int, v: SlotViews, b: int) -> None:
    for r, (lo, hi) in enumerate(v.bounds):  # piece r was reduced in rank r's slot
        if r != me and hi > lo:
            flat[k0 + lo : k0 + hi].copy_(v.piece[b][r][r])
