"""How each c10d collective call becomes an algorithm call (mixed into ShmProcessGroup).

Introduced in notebooks/04_custom_backend.ipynb.

Each method checks its arguments into the call's descriptor (an invalid argument becomes the
descriptor's ``error``, so every rank raises it together), flattens the tensors (a
non-contiguous tensor goes through a contiguous copy, copied back at the end), and hands a
closure that runs the algorithm from ``collectives.py`` to ``ShmProcessGroup._run``.
Data-movement collectives move bytes, so they work for every dtype.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from labkit.backends._pg_util import describe
from labkit.backends._shm import allreduce
from labkit.backends._shm import collectives as algo
from labkit.backends._shm.describe import OpDesc


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


class CollectiveCalls:
    """The collectives of ``ShmProcessGroup`` (which provides ``_desc``, ``_run``, ...)."""

    def allreduce(self, tensors, opts=None):
        """``dist.all_reduce``: reduce ``tensors[0]`` in place on every rank."""
        opts = opts or dist.AllreduceOptions()
        t = self._single(tensors, "all_reduce")
        desc = self._desc("all_reduce", t)
        op = self._reduction(desc, opts.reduceOp, t.dtype)

        def run():
            f = _Flat(t)
            allreduce.all_reduce(self._ex, f.flat, op, desc)
            f.done()

        return self._run(desc, run, tensors)

    def reduce(self, tensors, opts=None):
        """``dist.reduce``: the reduction lands on ``opts.rootRank``; others keep their input."""
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
        """``dist.broadcast``: every rank receives ``opts.rootRank``'s tensor."""
        opts = opts or dist.BroadcastOptions()
        t = self._single(tensors, "broadcast")
        desc = self._desc("broadcast", t, root=opts.rootRank)

        def run():
            f = _Flat(t)
            algo.broadcast(self._ex, _bytes(f.flat), opts.rootRank, desc)
            f.done()

        return self._run(desc, run, tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        """``dist.all_gather``: ``output_tensors[0][r]`` receives rank r's input."""
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
        """``dist.all_gather_into_tensor``: rank r's input lands in the r-th part of ``output``."""
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
        """``dist.gather``: on ``opts.rootRank``, ``output_tensors[0][r]`` gets rank r's input."""
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
        """``dist.scatter``: rank r receives the root's ``input_tensors[0][r]``."""
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
        """``dist.reduce_scatter``: rank r receives the reduction of every rank's input r."""
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
        """``dist.reduce_scatter_tensor``: rank r receives the reduced r-th part of ``input``."""
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
        """``dist.all_to_all``: rank i's ``input_tensors[j]`` lands in rank j's output i."""
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
        """``dist.all_to_all_single``: split sizes along dim 0 (equal parts when empty)."""
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
        """``dist.barrier``: return once every rank has entered it."""
        desc = self._desc("barrier", None)
        return self._run(desc, lambda: algo.barrier(self._ex, desc), [])


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
