"""``ShmProcessGroup``: the c10d ProcessGroup API on top of the shared-memory algorithms.

Introduced in notebooks/04_custom_backend.ipynb.

Creating one exchanges the ranks' pids through the store and maps the segment. Every
collective (its methods are in ``calls.py``) goes through ``_run``: number the call, run its
rounds, and turn a failure into the right state. A mismatch or invalid argument leaves every
rank at the same point, so the group stays usable; a dead peer, a timeout or an interrupt
leaves the ranks out of step, so the group refuses any further collective. Collectives run
to completion in the calling thread, so ``async_op=True`` returns a Work that is already
complete; sends and recvs are advanced by the group's progress thread and complete later.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from labkit.backends._pg_util import (
    REDUCE_OPS,
    PythonProcessGroup,
    completed_work,
    describe,
    dtype_name,
    reduce_op_name,
    reduction_error,
)
from labkit.backends._shm import collectives as algo
from labkit.backends._shm.calls import CollectiveCalls
from labkit.backends._shm.describe import KIND_CODE, ArgumentError, MismatchError, OpDesc
from labkit.backends._shm.p2p import PointToPoint
from labkit.backends._shm.segment import open_segment
from labkit.backends._shm.sync import PeerWatch, Rounds

BACKEND_NAME = "labkit_shm"


def _exchange_pids(store, rank: int, world_size: int, timeout: timedelta) -> list[int]:
    store.set(f"labkit_shm/pid/{rank}", str(os.getpid()))
    keys = [f"labkit_shm/pid/{r}" for r in range(world_size)]
    store.wait(keys, timeout)
    return [int(store.get(k)) for k in keys]


class ShmProcessGroup(CollectiveCalls, PythonProcessGroup):
    """A process group whose ranks on one host exchange data through shared memory.

    Args:
        store: the group's store (c10d passes a PrefixStore); carries the segment's name
            and the ranks' pids.
        rank: this process's rank in the group.
        world_size: number of ranks.
        timeout: how long any wait may last before it raises.

    Raises:
        RuntimeError: a rank died or did not join in time, or /dev/shm is too small.
    """

    def __init__(self, store, rank: int, world_size: int, timeout: timedelta) -> None:
        super().__init__(rank, world_size, BACKEND_NAME)
        self._n, self._rank = world_size, rank
        timeout_s = timeout.total_seconds()
        self._watch = PeerWatch(rank, _exchange_pids(store, rank, world_size, timeout))
        self._seg = open_segment(store, rank, world_size, timeout, self._watch)
        self._watch.segment = self._seg
        self._rounds = Rounds(self._seg, rank, self._watch, timeout_s)
        one_shot = int(os.environ.get("LABKIT_SHM_ONE_SHOT_BYTES", algo.ONE_SHOT_BYTES))
        self._ex = algo.Exchange(self._seg, self._rounds, one_shot)
        self._p2p = PointToPoint(self._seg, rank, self._watch, timeout_s)
        self._seq = 0
        self._broken: str | None = None
        self._lock = threading.Lock()  # collectives from several threads run one at a time

    def __repr__(self) -> str:
        return f"ShmProcessGroup(rank={self._rank}, world_size={self._n})"

    @property
    def slot_bytes(self) -> int:
        """Bytes one rank's slot holds: what one round of a collective carries."""
        return self._seg.layout.slot_bytes

    # -- the common path of every collective -----------------------------------------------
    def _desc(self, kind: str, t: torch.Tensor | None, **common) -> OpDesc:
        desc = OpDesc(kind, 0, describe(t) if t is not None else "", common)
        if t is not None:
            desc.common.update(dtype=dtype_name(t.dtype), numel=t.numel())
            if t.device.type != "cpu":
                desc.error = f"labkit_shm works on CPU tensors, got one on {t.device}"
            elif t.layout != torch.strided:
                desc.error = f"labkit_shm works on dense tensors, got layout {t.layout}"
        return desc

    def _reduction(self, desc: OpDesc, reduce_op, dtype: torch.dtype) -> str:
        op = reduce_op_name(reduce_op)
        error = reduction_error(op, dtype)
        if op not in REDUCE_OPS.values():  # nothing to run it with: fails on every rank
            desc.error = desc.error or error
            return "sum"
        desc.common["op"] = op
        desc.error = desc.error or error or ""
        return op

    def _run(self, desc: OpDesc, fn, result) -> dist.Work:
        with self._lock:
            if self._broken:
                raise RuntimeError(
                    f"labkit_shm: {desc.kind} on a group that failed earlier ({self._broken}); "
                    "create a new process group"
                )
            self._seq += 1
            desc.seq = self._seq
            self._ex.label = desc.label()
            self._rounds.enter(desc.seq, KIND_CODE[desc.kind])
            try:
                if desc.error:
                    self._ex.arrive(desc)  # raises ArgumentError on every rank
                # c10d moves data outside autograd, as gloo does: tensors that require grad
                # (DDP with create_graph=True) are reduced in place like any other.
                with torch.no_grad():
                    fn()
            except (ArgumentError, MismatchError):
                self._ex.next_round()  # every rank stops at the same point: still in step
                raise
            except BaseException as exc:
                self._broken = f"{desc.label()}: {exc}"
                raise
        return completed_work(result)

    @staticmethod
    def _single(tensors, what: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise ValueError(f"labkit_shm: {what} takes one tensor per rank, got {len(tensors)}")
        return tensors[0]

    def _check_list(self, desc: OpDesc, ts, like: torch.Tensor, what: str) -> None:
        if desc.error:
            return
        if len(ts) != self._n:
            desc.error = f"{what} has {len(ts)} tensors, expected world_size={self._n}"
            return
        for i, t in enumerate(ts):
            if t.dtype != like.dtype or t.numel() != like.numel():
                desc.error = f"{what}[{i}] is {describe(t)}, expected {describe(like)}-sized"
                return

    # -- point to point --------------------------------------------------------------------
    def _p2p_check(self, tensors, peer: int, what: str) -> torch.Tensor:
        t = self._single(tensors, what)
        if not 0 <= peer < self._n or peer == self._rank:
            raise ValueError(
                f"labkit_shm: {what} on rank {self._rank} to/from rank {peer}: the peer must be "
                f"another rank in 0..{self._n - 1}"
            )
        if t.device.type != "cpu" or t.layout != torch.strided:
            raise ValueError(f"labkit_shm: {what} works on dense CPU tensors, got {t.device}")
        return t

    def send(self, tensors, dstRank: int, tag: int = 0):  # noqa: N803 - c10d's names
        """``dist.isend``: returns at once; the Work completes once the bytes are in the ring."""
        t = self._p2p_check(tensors, dstRank, "send")
        return self._p2p.post("send", dstRank, tag, t)

    def recv(self, tensors, srcRank: int, tag: int = 0):  # noqa: N803
        """``dist.irecv`` from ``srcRank``: the first message from it with ``tag``."""
        t = self._p2p_check(tensors, srcRank, "recv")
        return self._p2p.post("recv", srcRank, tag, t)

    def recv_anysource(self, tensors, tag: int = 0):
        """``dist.recv(src=None)``: the first message with ``tag`` from any rank."""
        t = self._single(tensors, "recv")
        return self._p2p.post("recv", -1, tag, t)

    # -- life cycle ------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the progress thread and tell the peers this rank has left."""
        self._p2p.close()
        self._rounds.leave()

    def abort(self) -> None:
        """Same as ``shutdown``: nothing is left to tear down in the peers."""
        self.shutdown()
