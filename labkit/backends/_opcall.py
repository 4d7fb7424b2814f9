"""What a wrapping backend's hooks see of each operation, and how they learn it finished.

Introduced in notebooks/04_custom_backend.ipynb.

``OpCall`` describes one operation (torch.distributed's name for it, its tensors, its size as
nccl-tests counts it, the global ranks involved). ``when_complete(work, fn)`` runs ``fn()``
when the operation completes. Used by ``labkit.backends._wrapper.WrapperProcessGroup``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class OpCall:
    """One operation as a hook sees it (global ranks; sizes as nccl-tests counts them).

    ``n_bytes`` is the buffer nccl-tests reports as the size (NVIDIA nccl-tests,
    doc/PERFORMANCE.md): the tensor for all_reduce, broadcast, reduce, send and recv; the
    whole gathered or scattered buffer (every rank's part) for all_gather, reduce_scatter,
    gather, scatter and all_to_all — the same number on every rank.
    """

    op: str  # torch.distributed's name: "all_reduce", "all_gather_into_tensor", "send", ...
    method: str  # the ProcessGroup method called: "allreduce", "all_gather_single", ...
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    n_bytes: int
    dtype: str  # e.g. "float32"; "" for a barrier
    participants: tuple[int, ...]  # global ranks: the whole group; (src, dst) for send/recv
    peer: int | None = None  # global rank at the other end of a send/recv (None: any source)
    root: int | None = None  # global root rank of broadcast, reduce, gather, scatter
    reduce_op: str | None = None  # "SUM", "AVG", ... for reductions
    start_ns: int = 0  # lk.trace.clock_ns() when the op was called


def flat(tensors) -> list[torch.Tensor]:
    """Every tensor in a tensor, a list, or a list of lists, in order."""
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    out: list[torch.Tensor] = []
    for t in tensors:
        out += flat(t)
    return out


def nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def dtype_name(tensors: Sequence[torch.Tensor]) -> str:
    return str(tensors[0].dtype).removeprefix("torch.") if tensors else ""


class WrappedWork(dist.Work):
    """A Work that answers every query from the inner Work it wraps.

    Subclasses change what they need (when it counts as complete, what its future does); the
    rest of torch's Work interface passes straight through.
    """

    def __init__(self, inner: dist.Work) -> None:
        super().__init__()
        self._inner = inner

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return self._inner.wait(timeout)

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def is_success(self) -> bool:
        return self._inner.is_success()

    def exception(self):
        return self._inner.exception()

    def source_rank(self) -> int:
        return self._inner.source_rank()

    def _source_rank(self) -> int:
        return self._inner._source_rank()

    def result(self) -> list[torch.Tensor]:
        return self._inner.result()

    def synchronize(self) -> None:
        self._inner.synchronize()

    def get_future(self):
        return self._inner.get_future()


class _NotifyingWork(WrappedWork):
    """A Work without a future (gloo send/recv): report completion when the caller sees it."""

    def __init__(self, inner: dist.Work, done: Callable[[], None]) -> None:
        super().__init__(inner)
        self._done, self._fired = done, False

    def _fire(self) -> None:
        if not self._fired:
            self._fired = True
            self._done()

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        ok = self._inner.wait(timeout)
        self._fire()
        return ok

    def is_completed(self) -> bool:
        done = self._inner.is_completed()
        if done:
            self._fire()
        return done


def when_complete(work: dist.Work, done: Callable[[], None]) -> dist.Work:
    """Arrange for ``done()`` to run once when ``work`` completes; return the Work to hand out.

    Args:
        work: the inner group's Work.
        done: called with no arguments at completion (possibly on the backend's thread).

    Returns:
        ``work`` itself when it has a future (``done`` runs from the future's callback, at
        completion); otherwise a Work that wraps it and calls ``done`` when the caller's
        ``wait()`` or ``is_completed()`` first reports completion (gloo's send and recv).
    """
    try:
        fut = work.get_future()
    except RuntimeError:  # "Work::getFuture not implemented"
        return _NotifyingWork(work, done)
    fut.add_done_callback(lambda _: done())
    return work
