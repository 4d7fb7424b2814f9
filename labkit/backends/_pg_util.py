"""Helpers that any ProcessGroup written in Python needs: Work objects, reduce ops, dtype checks.

Introduced in notebooks/04_custom_backend.ipynb.

In torch 2.13 a Python backend subclasses ``torch.distributed.ProcessGroup`` (the c10d
``Backend`` class has no Python constructor until 2.14). Such a group must hand back a ``Work``
whose future holds the output tensors (DDP's reducer reads ``work.get_future().value()``), map
``opts.reduceOp`` (an object: compare ``.op``) to an operation, and refuse what it cannot do
with a message that lists what it can. Nothing here knows about a particular transport.
Reference: torch/testing/_internal/distributed/multi_threaded_pg.py (the shape of a Python
group), torch/csrc/distributed/c10d/PyProcessGroup.hpp (which methods C++ callers reach).
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, _create_work_from_future

_R = dist.ReduceOp.RedOpType
REDUCE_OPS: dict[object, str] = {
    _R.SUM: "sum",
    _R.AVG: "avg",
    _R.PRODUCT: "product",
    _R.MIN: "min",
    _R.MAX: "max",
    _R.BAND: "band",
    _R.BOR: "bor",
    _R.BXOR: "bxor",
}
BITWISE_OPS = ("band", "bor", "bxor")
_ALIASES = {"prod": "product", "mean": "avg"}
# The dtypes a reduction accepts: every float and integer type gloo and torch's CPU kernels
# reduce, plus int16 (which gloo lacks).
REDUCE_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def describe(t: torch.Tensor) -> str:
    """A tensor as error messages show it: ``float32[3, 4]`` (``float32[]`` for a scalar)."""
    return f"{dtype_name(t.dtype)}[{', '.join(str(s) for s in t.shape)}]"


def reduce_op_name(op) -> str:
    """The lower-case name of a reduction op, however it is given.

    The one place where a reduction op becomes a name: labkit's backends, the wrapping
    backends' records and ``lk.collectives`` read it here, and each checks what it supports
    (``reduction_error``, ``lk.collectives.op_name``).

    Args:
        op: ``opts.reduceOp`` (a ``ReduceOp`` object), ``dist.ReduceOp.SUM`` (a
            ``RedOpType``), or a name such as ``"sum"`` or ``"PROD"`` (``prod`` and ``mean``
            are read as ``product`` and ``avg``).

    Returns:
        ``"sum"``, ``"avg"``, ``"product"``, ``"min"``, ``"max"``, ``"band"``, ``"bor"``,
        ``"bxor"``, ``"premul_sum"`` (NCCL only), or the lower-cased name given.
    """
    if isinstance(op, str):
        name = op.lower()
    else:
        kind = getattr(op, "op", op)  # a ReduceOp object wraps its RedOpType in .op
        name = str(getattr(kind, "name", kind)).lower()
    return _ALIASES.get(name, name)


def reduction_error(op: str, dtype: torch.dtype, dtypes=REDUCE_DTYPES) -> str | None:
    """Why ``op`` cannot reduce tensors of ``dtype`` (None when it can).

    Args:
        op: a name from ``reduce_op_name``.
        dtype: the tensors' dtype.
        dtypes: the dtypes the backend reduces.

    Returns:
        An error text that names what is supported, or None.
    """
    if op not in REDUCE_OPS.values():  # e.g. PREMUL_SUM, which only NCCL has
        supported = ", ".join(n.upper() for n in REDUCE_OPS.values())
        return f"unsupported reduce op {op.upper()}: supported are {supported}"
    if dtype not in dtypes:
        names = ", ".join(dtype_name(d) for d in dtypes)
        return f"cannot reduce {dtype_name(dtype)} tensors: supported dtypes are {names}"
    if op == "avg" and not dtype.is_floating_point:
        return f"ReduceOp.AVG needs a floating-point dtype, got {dtype_name(dtype)}"
    if op in BITWISE_OPS and dtype.is_floating_point:
        return f"ReduceOp.{op.upper()} needs an integer or bool dtype, got {dtype_name(dtype)}"
    return None


_BINARY = {
    "sum": torch.add,  # on bool: OR, like gloo
    "avg": torch.add,
    "product": torch.mul,  # on bool: AND
    "min": torch.minimum,
    "max": torch.maximum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}


def reduce_rows(rows, op: str, out: torch.Tensor) -> torch.Tensor:
    """Reduce the rows of ``rows`` element-wise into ``out`` (shape [m]).

    A chain of binary ops in row order, ``out = ((row0 op row1) op row2) ...``, as gloo
    reduces: every rank that reduces the same rows gets bit-identical results (which keeps
    DDP replicas equal), integer sums and products wrap around, bool SUM is OR and PRODUCT is
    AND. (A chain of element-wise ops also runs several times faster on CPU than
    ``torch.sum(rows, dim=0)``, whose reduction over the outer dimension is not vectorised
    well.) ``out`` must not overlap ``rows``.

    Args:
        rows: one row per rank: a [n, m] tensor (any strides) or a list of n [m] tensors.
        op: a name from ``reduce_op_name``.
        out: [m] tensor of the same dtype receiving the result.

    Returns:
        ``out``.

    Raises:
        ValueError: for an op/dtype pair that ``reduction_error`` rejects.
    """
    err = reduction_error(op, out.dtype)
    if err:
        raise ValueError(err)
    n = len(rows)
    fn = _BINARY[op]
    if n == 1:
        out.copy_(rows[0])
    else:
        fn(rows[0], rows[1], out=out)
        for r in range(2, n):
            fn(out, rows[r], out=out)
    return out.div_(n) if op == "avg" else out


def reduce_into_row(rows: torch.Tensor, keep: int, op: str) -> torch.Tensor:
    """Reduce every row of ``rows`` ([n, m]) into row ``keep``, in place.

    The order is row ``keep`` first, then the others in row order. Used where each piece of
    a result is reduced by exactly one rank, so every rank still sees the same values.

    Args:
        rows: one row per rank, [n, m]; row ``keep`` is overwritten.
        keep: the row receiving the result.
        op: a name from ``reduce_op_name``.

    Returns:
        ``rows[keep]``.

    Raises:
        ValueError: for an op/dtype pair that ``reduction_error`` rejects.
    """
    err = reduction_error(op, rows.dtype)
    if err:
        raise ValueError(err)
    acc, fn = rows[keep], _BINARY[op]
    for r in range(rows.shape[0]):
        if r != keep:
            fn(acc, rows[r], out=acc)
    return acc.div_(rows.shape[0]) if op == "avg" else acc


def completed_work(result) -> dist.Work:
    """A finished ``Work`` whose future holds ``result`` (usually the output tensors).

    Args:
        result: what ``work.get_future().value()`` returns; DDP expects a list of tensors.

    Returns:
        A ``Work`` that is already complete: ``wait()`` returns at once.
    """
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class FutureWork(dist.Work):
    """A ``Work`` that finishes when its future does; ``complete`` and ``fail`` end it.

    For operations that finish on another thread (send/recv). It also answers
    ``_source_rank()``, which ``dist.recv(src=None)`` asks of the work after waiting.
    """

    def __init__(self) -> None:
        super().__init__()
        self.future: torch.futures.Future = torch.futures.Future()
        self.source_rank = -1

    def complete(self, result, source_rank: int = -1) -> None:
        self.source_rank = source_rank
        self.future.set_result(result)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    def wait(self, timeout=None) -> bool:
        """Wait for the operation; with a positive ``timeout`` (a timedelta), at most that long.

        Raises:
            RuntimeError: the operation's error, or "Timed out waiting ..." (c10d's words).
        """
        seconds = timeout.total_seconds() if timeout is not None else 0.0
        if seconds > 0 and not self.future.done():
            done = threading.Event()
            self.future.add_done_callback(lambda _: done.set())
            if not done.wait(seconds):
                raise RuntimeError(f"Timed out waiting {seconds:g} s for the operation")
        self.future.wait()  # raises the operation's error, if any
        return True

    def is_completed(self) -> bool:
        return self.future.done()

    def is_success(self) -> bool:
        return self.future.done() and self.exception() is None

    def exception(self):
        try:
            self.future.value()
        except Exception as exc:  # noqa: BLE001 - the operation's error, whatever it is
            return exc
        return None

    def get_future(self) -> torch.futures.Future:
        return self.future

    def result(self):
        return self.future.value()

    def _source_rank(self) -> int:
        return self.source_rank


class PythonProcessGroup(dist.ProcessGroup):
    """Base for process groups written in Python: naming and the aliases torch calls.

    ``init_device_mesh`` reads ``group.group_name``; for a Python group the C++ getter looks
    for a registered backend and raises "ProcessGroup name not set", so the name torch assigns
    through ``_set_group_name`` is kept here. Subclasses implement ``all_gather_single``,
    ``reduce_scatter_single`` and ``all_to_all_single``; the older and coalesced names that
    FSDP2, DTensor and C++ callers use are forwarded to them.
    """

    def __init__(self, rank: int, world_size: int, backend_name: str) -> None:
        super().__init__(rank, world_size)
        self._labkit_group_name = ""
        self._labkit_group_desc = ""
        self._labkit_backend_name = backend_name

    def getBackendName(self) -> str:  # noqa: N802 - the C++ name the trampoline looks up
        return self._labkit_backend_name

    @property
    def group_name(self) -> str:
        return self._labkit_group_name

    def _set_group_name(self, name: str) -> None:
        self._labkit_group_name = name

    @property
    def group_desc(self) -> str:
        return self._labkit_group_desc

    def _set_group_desc(self, desc: str) -> None:
        self._labkit_group_desc = desc

    # -- aliases: one implementation, every name torch uses for it --------------------------
    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's parameter name
        return self.all_gather_single(output, input, opts or AllgatherOptions())

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        return self.reduce_scatter_single(output, input, opts or dist.ReduceScatterOptions())

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        opts = opts or dist.AllToAllOptions()
        return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or AllgatherOptions()
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _all_done(works, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        pairs = zip(outputs, inputs, strict=True)
        works = [self.reduce_scatter_single(o, i, opts) for o, i in pairs]
        return _all_done(works, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def allreduce_coalesced(self, tensors, opts=None):
        works = []
        for t in tensors:
            one = dist.AllreduceOptions()
            if opts is not None:
                one.reduceOp = opts.reduceOp
            works.append(self.allreduce([t], one))
        return _all_done(works, tensors)

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        """``dist.all_gather_coalesced``: ``output_lists[r][j]`` receives rank r's input j.

        c10d passes the outputs rank-major, one list per rank (``ProcessGroupGloo``'s
        ``allgather_coalesced`` checks ``output_lists.size() == size`` and
        ``output_lists[r].size() == input_list.size()``), so input j's all_gather writes
        into the j-th tensor of every rank's list.
        """
        opts = opts or AllgatherOptions()
        n = self.size()
        if len(output_lists) != n or any(len(outs) != len(inputs) for outs in output_lists):
            shape = [len(outs) for outs in output_lists]
            raise ValueError(
                f"all_gather_coalesced: output_tensor_lists must hold world_size={n} lists "
                f"(one per rank) of {len(inputs)} tensors (one per input), got lists of "
                f"{shape} tensors"
            )
        works = [
            self.allgather([[outs[j] for outs in output_lists]], [inp], opts)
            for j, inp in enumerate(inputs)
        ]
        return _all_done(works, output_lists)


def _all_done(works: list, result) -> dist.Work:
    for w in works:
        w.wait()
    return completed_work(result)
