"""``ShmProcessGroup``: the c10d ProcessGroup API on top of the shared-memory algorithms.

Introduced in notebooks/04_custom_backend.ipynb.

Each method checks its arguments, describes the call for the descriptor check, flattens the
tensors (a non-contiguous tensor goes through a contiguous copy and is copied back), runs the
algorithm from ``collectives.py`` and returns a ``Work``. Collectives run to completion in the
calling thread, so ``async_op=True`` returns a Work that is already complete; sends and recvs
are advanced by the group's progress thread and complete later.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from labkit.backends._pg_util import (
    PythonProcessGroup,
    completed_work,
    describe,
    dtype_name,
    reduce_op_name,
    reduction_error,
)
from labkit.backends._shm import collectives as algo
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


class _Flat:
    """A 1-D contiguous view of a tensor; ``done()`` copies back when a copy had to be made."""

    def __init__(self, t: torch.Tensor) -> None:
        self.user = t
        self.copy = not t.is_contiguous()
        self.flat = (t.contiguous() if self.copy else t).reshape(-1)

    def done(self) -> None:
        if self.copy:
            self.user.copy_(self.flat.view(self.user.shape))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)  # data-movement collectives move bytes: every dtype works


class ShmProcessGroup(PythonProcessGroup):
    """A process group whose ranks on one host exchange data through shared memory.

    Introduced in notebooks/04_custom_backend.ipynb.

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
        try:
            op = reduce_op_name(reduce_op)
        except ValueError as exc:
            desc.error = desc.error or str(exc)
            return "sum"
        desc.common["op"] = op
        desc.error = desc.error or reduction_error(op, dtype) or ""
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

    # -- collectives -----------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        t = self._single(tensors, "all_reduce")
        desc = self._desc("all_reduce", t)
        op = self._reduction(desc, opts.reduceOp, t.dtype)

        def run():
            f = _Flat(t)
            algo.all_reduce(self._ex, f.flat, op, desc)
            f.done()

        return self._run(desc, run, tensors)

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        t = self._single(tensors, "reduce")
        desc = self._desc("reduce", t, root=opts.rootRank)
        op = self._reduction(desc, opts.reduceOp, t.dtype)

        def run():
            f = _Flat(t)
            algo.reduce(self._ex, f.flat, op, opts.rootRank, desc)
            f.done()

        return self._run(desc, run, tensors)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        t = self._single(tensors, "broadcast")
        desc = self._desc("broadcast", t, root=opts.rootRank)

        def run():
            f = _Flat(t)
            algo.broadcast(self._ex, _bytes(f.flat), opts.rootRank, desc)
            f.done()

        return self._run(desc, run, tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        t = self._single(input_tensors, "all_gather")
        outs = self._single(output_tensors, "all_gather")
        desc = self._desc("all_gather", t)
        self._check_list(desc, outs, t, "output_tensor_list")

        def run():
            flats = [_Flat(o) for o in outs]
            inp = _bytes(_Flat(t).flat)
            algo.all_gather(self._ex, inp, [_bytes(f.flat) for f in flats], desc)
            for f in flats:
                f.done()

        return self._run(desc, run, output_tensors)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 - torch's name
        desc = self._desc("all_gather_into_tensor", input)
        if not desc.error and (
            output.dtype != input.dtype or output.numel() != self._n * input.numel()
        ):
            desc.error = (
                f"output {describe(output)} must hold world_size={self._n} x input "
                f"{describe(input)}"
            )

        def run():
            out = _Flat(output)
            rows = _bytes(out.flat).view(self._n, -1)
            algo.all_gather(self._ex, _bytes(_Flat(input).flat), rows, desc)
            out.done()

        return self._run(desc, run, [output])

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        t = self._single(input_tensors, "gather")
        root = opts.rootRank
        desc = self._desc("gather", t, root=root)
        outs = None
        if self._rank == root:
            outs = self._single(output_tensors, "gather") if output_tensors else []
            self._check_list(desc, outs, t, "gather_list")

        def run():
            flats = [_Flat(o) for o in outs] if outs is not None else None
            dst = [_bytes(f.flat) for f in flats] if flats is not None else None
            algo.gather(self._ex, _bytes(_Flat(t).flat), dst, root, desc)
            for f in flats or []:
                f.done()

        return self._run(desc, run, output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        t = self._single(output_tensors, "scatter")
        root = opts.rootRank
        desc = self._desc("scatter", t, root=root)
        ins = None
        if self._rank == root:
            ins = self._single(input_tensors, "scatter") if input_tensors else []
            self._check_list(desc, ins, t, "scatter_list")

        def run():
            out = _Flat(t)
            src = [_bytes(_Flat(i).flat) for i in ins] if ins is not None else None
            algo.scatter(self._ex, src, _bytes(out.flat), root, desc)
            out.done()

        return self._run(desc, run, output_tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        t = self._single(output_tensors, "reduce_scatter")
        ins = self._single(input_tensors, "reduce_scatter")
        desc = self._desc("reduce_scatter", t)
        op = self._reduction(desc, opts.reduceOp, t.dtype)
        self._check_list(desc, ins, t, "input_list")

        def run():
            out = _Flat(t)
            algo.reduce_scatter(self._ex, [_Flat(i).flat for i in ins], out.flat, op, desc)
            out.done()

        return self._run(desc, run, output_tensors)

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002 - torch's name
        opts = opts or dist.ReduceScatterOptions()
        desc = self._desc("reduce_scatter_tensor", output)
        op = self._reduction(desc, opts.reduceOp, output.dtype)
        if not desc.error and (
            input.dtype != output.dtype or input.numel() != self._n * output.numel()
        ):
            desc.error = (
                f"input {describe(input)} must hold world_size={self._n} x output "
                f"{describe(output)}"
            )

        def run():
            out = _Flat(output)
            rows = _Flat(input).flat.view(self._n, -1)
            algo.reduce_scatter(self._ex, rows, out.flat, op, desc)
            out.done()

        return self._run(desc, run, [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        ref = input_tensors[0] if input_tensors else torch.empty(0)
        desc = self._desc("all_to_all", ref)
        desc.common.pop("numel", None)  # sizes may differ per pair; checked pairwise instead
        if len(input_tensors) != self._n or len(output_tensors) != self._n:
            desc.error = f"all_to_all needs world_size={self._n} input and output tensors"
        elif any(t.dtype != ref.dtype for t in [*input_tensors, *output_tensors]):
            desc.error = "all_to_all needs one dtype for every input and output tensor"
        else:
            desc.sends = [t.numel() for t in input_tensors]
            desc.recvs = [t.numel() for t in output_tensors]

        def run():
            outs = [_Flat(o) for o in output_tensors]
            sends = [_bytes(_Flat(i).flat) for i in input_tensors]
            recvs = [_bytes(f.flat) for f in outs]
            algo.all_to_all(self._ex, sends, recvs, desc, ref.element_size())
            for f in outs:
                f.done()

        return self._run(desc, run, output_tensors)

    def all_to_all_single(  # noqa: PLR0913 - c10d's signature
        self,
        output,
        input,  # noqa: A002 - torch's name
        output_split_sizes,
        input_split_sizes,
        opts=None,
    ):
        desc = self._desc("all_to_all_single", input)
        desc.common.pop("numel", None)
        sends = _splits(desc, input, list(input_split_sizes), self._n, "input")
        recvs = _splits(desc, output, list(output_split_sizes), self._n, "output")
        if not desc.error and output.dtype != input.dtype:
            desc.error = f"output {describe(output)} and input {describe(input)} differ in dtype"
        if not desc.error:
            desc.sends, desc.recvs = sends, recvs

        def run():
            es = input.element_size()
            out = _Flat(output)
            src = _cut(_bytes(_Flat(input).flat), [s * es for s in sends])
            dst = _cut(_bytes(out.flat), [r * es for r in recvs])
            algo.all_to_all(self._ex, src, dst, desc, es)
            out.done()

        return self._run(desc, run, [output])

    def barrier(self, opts=None):
        desc = self._desc("barrier", None)
        return self._run(desc, lambda: algo.barrier(self._ex, desc), [])

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
        t = self._p2p_check(tensors, dstRank, "send")
        return self._p2p.post("send", dstRank, tag, t)

    def recv(self, tensors, srcRank: int, tag: int = 0):  # noqa: N803
        t = self._p2p_check(tensors, srcRank, "recv")
        return self._p2p.post("recv", srcRank, tag, t)

    def recv_anysource(self, tensors, tag: int = 0):
        t = self._single(tensors, "recv")
        return self._p2p.post("recv", -1, tag, t)

    # -- life cycle ------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the progress thread and tell the peers this rank has left."""
        self._p2p.close()
        self._rounds.leave()

    def abort(self) -> None:
        self.shutdown()


def _splits(desc: OpDesc, t: torch.Tensor, splits: list[int], n: int, what: str) -> list[int]:
    """Elements per rank for all_to_all_single, from split sizes along dim 0."""
    if desc.error:
        return []
    if t.dim() == 0:
        desc.error = f"all_to_all_single needs tensors with a dim 0, {what} is a scalar"
        return []
    rows, row = t.shape[0], t.numel() // max(1, t.shape[0])
    if not splits:
        if rows % n:
            desc.error = f"{what} has {rows} rows along dim 0, not divisible by world_size={n}"
            return []
        splits = [rows // n] * n
    if len(splits) != n or sum(splits) != rows or min(splits) < 0:
        desc.error = f"{what}_split_sizes {splits} must be {n} sizes summing to {rows}"
        return []
    return [s * row for s in splits]


def _cut(flat: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    out, start = [], 0
    for s in sizes:
        out.append(flat[start : start + s])
        start += s
    return out
