"""A process group that hands every operation to an inner process group, with hooks around it.

Introduced in notebooks/04_custom_backend.ipynb.

``WrapperProcessGroup(inner)`` is a ``torch.distributed.ProcessGroup`` subclass (in torch 2.13
the c10d ``Backend`` cannot be subclassed in Python; a ``ProcessGroup`` can) that implements
every operation torch calls on a group — the collectives and p2p ops of ``dist.*``, those
DDP's C++ reducer calls (``allgather``, ``broadcast``, ``allreduce``) and FSDP2's
(``all_gather_single``, ``reduce_scatter_single``, the ``*_coalesced`` forms) — by describing
it as an ``OpCall`` and calling the same method on ``inner``. Results are exactly the inner
group's: the same tensors, the same ``Work``.

To build a backend on top (the recording and simulated-network backends do), subclass it,
set ``backend_name`` and override one or both hooks::

    class Slow(WrapperProcessGroup):
        backend_name = "slow"

        def before_op(self, call: OpCall) -> None:  # before the inner op is issued
            time.sleep(1e-9 * call.n_bytes)  # 1 GB/s

        def after_op(self, call: OpCall, work: dist.Work) -> dist.Work:  # the caller's Work
            return when_complete(work, lambda: print(call.op, "done"))

``before_op`` may block (the caller waits); ``after_op`` returns the Work the caller gets —
the inner one, or another that completes later. ``when_complete`` (``labkit.backends._opcall``)
runs a function when the op finishes. ``labkit.backends._inner.create_inner`` builds the
inner group (gloo, a labkit backend, or any registered one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

import torch._C._distributed_c10d as C
import torch.distributed as dist

from labkit.backends._opcall import OpCall, dtype_name, flat, nbytes
from labkit.backends._pg_util import reduce_op_name
from labkit.trace.spans import clock_ns


class WrapperProcessGroup(dist.ProcessGroup):
    """Delegate every operation to ``inner``, calling ``before_op`` / ``after_op`` around it.

    Args:
        inner: the process group that does the work.
        global_ranks: global rank of each rank of this group (default: ``range(size)``).

    Raises:
        ValueError: ``global_ranks`` does not have one entry per rank of ``inner``.
    """

    backend_name = "labkit_wrapper"

    def __init__(self, inner: dist.ProcessGroup, global_ranks: Sequence[int] | None = None):
        super().__init__(inner.rank(), inner.size())
        self.inner = inner
        self.global_ranks = tuple(global_ranks) if global_ranks else tuple(range(inner.size()))
        if len(self.global_ranks) != inner.size():
            raise ValueError(f"{len(self.global_ranks)} global ranks for a group of {inner.size()}")
        self._group_name: str | None = None
        self._group_desc: str | None = None

    # -- the hooks ---------------------------------------------------------------------------
    def before_op(self, call: OpCall) -> None:
        """Runs on the caller's thread before the inner operation is issued (default: nothing)."""

    def after_op(self, call: OpCall, work: dist.Work) -> dist.Work:
        """Runs after it was issued; returns the Work the caller gets (default: ``work``)."""
        return work

    def _run(self, call: OpCall, issue: Callable[..., dist.Work], *args) -> dist.Work:
        call.start_ns = clock_ns()
        self.before_op(call)
        return self.after_op(call, issue(*args))

    def _call(self, op, method, inputs, outputs, n_bytes=None, **facts) -> OpCall:
        inputs, outputs = flat(inputs), flat(outputs)
        size = nbytes(outputs) if n_bytes is None else n_bytes
        dtype = dtype_name(inputs or outputs)
        return OpCall(op, method, inputs, outputs, size, dtype, self.global_ranks, **facts)

    def _p2p(self, op, method, tensors, peer: int | None) -> OpCall:
        me = self.global_ranks[self.rank()]
        ends = (me, peer) if op == "send" else (peer, me)
        call = self._call(op, method, tensors, tensors, peer=peer)
        call.participants = tuple(r for r in ends if r is not None)
        return call

    def _global(self, group_rank: int) -> int:
        return self.global_ranks[group_rank]

    # -- identity ----------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - the C++ virtual's name
        return self.backend_name

    def name(self) -> str:
        return self.backend_name

    def _set_group_name(self, name: str) -> None:
        # Keep the name torch assigns (DeviceMesh looks groups up by it); pass it inside.
        self._group_name = name
        self.inner._set_group_name(name)

    @property
    def group_name(self) -> str:
        if self._group_name is None:
            raise RuntimeError("ProcessGroup name not set")
        return self._group_name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc
        self.inner._set_group_desc(desc)

    @property
    def group_desc(self) -> str:
        return self._group_desc or "undefined"

    # -- collectives (argument names are torch's) ---------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts or C.AllreduceOptions()
        red = reduce_op_name(opts.reduceOp).upper()
        call = self._call("all_reduce", "allreduce", tensors, tensors, reduce_op=red)
        return self._run(call, self.inner.allreduce, tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or C.AllreduceCoalescedOptions()
        red = reduce_op_name(opts.reduceOp).upper()
        call = self._call(
            "all_reduce_coalesced", "allreduce_coalesced", tensors, tensors, reduce_op=red
        )
        return self._run(call, self.inner.allreduce_coalesced, tensors, opts)

    def broadcast(self, tensors, opts=None):
        opts = opts or C.BroadcastOptions()
        call = self._call(
            "broadcast", "broadcast", tensors, tensors, root=self._global(opts.rootRank)
        )
        return self._run(call, self.inner.broadcast, tensors, opts)

    def reduce(self, tensors, opts=None):
        opts = opts or C.ReduceOptions()
        root, red = self._global(opts.rootRank), reduce_op_name(opts.reduceOp).upper()
        call = self._call("reduce", "reduce", tensors, tensors, root=root, reduce_op=red)
        return self._run(call, self.inner.reduce, tensors, opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or C.AllgatherOptions()
        call = self._call("all_gather", "allgather", input_tensors, output_tensors)
        return self._run(call, self.inner.allgather, output_tensors, input_tensors, opts)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        opts = opts or C.AllgatherOptions()
        call = self._call("all_gather_coalesced", "allgather_coalesced", input_list, output_lists)
        return self._run(call, self.inner.allgather_coalesced, output_lists, input_list, opts)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002
        opts = opts or C.AllgatherOptions()
        call = self._call("all_gather_into_tensor", "all_gather_single", input, output)
        return self._run(call, self.inner.all_gather_single, output, input, opts)

    _allgather_base = all_gather_single  # the older name of the same method

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or C.AllgatherOptions()
        op = "all_gather_into_tensor_coalesced"
        call = self._call(op, "all_gather_single_coalesced", inputs, outputs)
        return self._run(call, self.inner.all_gather_single_coalesced, outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or C.ReduceScatterOptions()
        size, red = nbytes(flat(input_tensors)), reduce_op_name(opts.reduceOp).upper()
        call = self._call(
            "reduce_scatter", "reduce_scatter", input_tensors, output_tensors, size, reduce_op=red
        )
        return self._run(call, self.inner.reduce_scatter, output_tensors, input_tensors, opts)

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        opts = opts or C.ReduceScatterOptions()
        size, red = nbytes([input]), reduce_op_name(opts.reduceOp).upper()
        op = "reduce_scatter_tensor"
        call = self._call(op, "reduce_scatter_single", input, output, size, reduce_op=red)
        return self._run(call, self.inner.reduce_scatter_single, output, input, opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or C.ReduceScatterOptions()
        size, red = nbytes(flat(inputs)), reduce_op_name(opts.reduceOp).upper()
        op, method = "reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced"
        call = self._call(op, method, inputs, outputs, size, reduce_op=red)
        return self._run(call, self.inner.reduce_scatter_single_coalesced, outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        opts = opts or C.AllToAllOptions()
        call = self._call("all_to_all_single", "all_to_all_single", input, output, nbytes([input]))
        args = (output, input, output_split_sizes, input_split_sizes, opts)
        return self._run(call, self.inner.all_to_all_single, *args)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or C.AllToAllOptions()
        size = nbytes(flat(input_tensors))
        call = self._call("all_to_all", "alltoall", input_tensors, output_tensors, size)
        return self._run(call, self.inner.alltoall, output_tensors, input_tensors, opts)

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or C.GatherOptions()
        size, root = nbytes(flat(input_tensors)) * self.size(), self._global(opts.rootRank)
        call = self._call("gather", "gather", input_tensors, output_tensors, size, root=root)
        return self._run(call, self.inner.gather, output_tensors, input_tensors, opts)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or C.ScatterOptions()
        size, root = nbytes(flat(output_tensors)) * self.size(), self._global(opts.rootRank)
        call = self._call("scatter", "scatter", input_tensors, output_tensors, size, root=root)
        return self._run(call, self.inner.scatter, output_tensors, input_tensors, opts)

    def barrier(self, opts=None):
        opts = opts or C.BarrierOptions()
        return self._run(self._call("barrier", "barrier", [], []), self.inner.barrier, opts)

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        self.inner.monitored_barrier(timeout, wait_all_ranks)

    # -- point to point ----------------------------------------------------------------------
    def send(self, tensors, dstRank: int, tag: int):  # noqa: N803 - the C++ names
        call = self._p2p("send", "send", tensors, self._global(dstRank))
        return self._run(call, self.inner.send, tensors, dstRank, tag)

    def recv(self, tensors, srcRank: int, tag: int):  # noqa: N803
        call = self._p2p("recv", "recv", tensors, self._global(srcRank))
        return self._run(call, self.inner.recv, tensors, srcRank, tag)

    def recv_anysource(self, tensors, tag: int):
        call = self._p2p("recv", "recv_anysource", tensors, None)
        return self._run(call, self.inner.recv_anysource, tensors, tag)

    # -- life cycle --------------------------------------------------------------------------
    def _start_coalescing(self, device) -> None:
        self.inner._start_coalescing(device)

    def _end_coalescing(self, device):
        return self.inner._end_coalescing(device)

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)

    def _get_sequence_number_for_group(self) -> int:
        return self.inner._get_sequence_number_for_group()

    def abort(self) -> None:
        self.inner.abort()

    def shutdown(self) -> None:
        self.inner.shutdown()
