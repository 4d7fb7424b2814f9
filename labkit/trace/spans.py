"""Per-rank spans: what this rank was doing, and when, on a clock every rank on a host shares.

Introduced in notebooks/04_custom_backend.ipynb.

``with span("forward", kind="compute"):`` records one ``Span`` in this process (a rank is a
process, so this is the rank's own list; no process group is involved). ``events()`` returns
them together with the communication the recording backend (``labkit.backends.recording``)
saw on this rank, as spans of kind ``"comm"``. This module imports neither torch nor
matplotlib.

The clock is ``time.perf_counter_ns()``: on Linux and macOS it reads the system-wide
monotonic clock (``CLOCK_MONOTONIC``, ``mach_absolute_time``), so timestamps taken in
different processes on one host are directly comparable; ``Timeline.merge`` takes per-rank
offsets for clocks that are not (ranks on several hosts).

CUDA work is asynchronous: a kernel or an NCCL operation returns to the host once it is queued
on the current stream, so a host clock read right after it measures the queueing, not the work.
``sync_device`` waits for every stream of the device (for timing whole steps and benchmarks);
``span(..., device=...)`` waits for the current stream only, so a span covers the kernels its
block queued while NCCL's own stream keeps running — overlap stays visible, and a collective
the block waited for is covered, because ``Work.wait()`` makes the current stream wait for it.
These are the one place labkit's timers synchronise; both are no-ops for CPU tensors.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

COMPUTE = "compute"
COMM = "comm"


def clock_ns() -> int:
    """Nanoseconds on the clock shared by every process of this host (spans and records).

    Returns:
        ``time.perf_counter_ns()``: monotonic, system-wide on Linux and macOS.
    """
    return time.perf_counter_ns()


def sync_device(device: Any) -> None:
    """Wait for the work queued on ``device`` if it is a GPU, so a host clock measures it.

    PyTorch's CUDA semantics notes ("Asynchronous execution"): "time measurements without
    synchronizations are not accurate", so call ``torch.cuda.synchronize()`` before measuring;
    on NCCL ``Work.wait()`` and collectives return once the work is queued on the current
    stream. Read the clock after this call.

    Args:
        device: a ``torch.device`` (or its string, e.g. ``"cuda:0"``); CPU or None is a no-op.

    Returns:
        None.
    """
    if _is_cuda(device):
        import torch  # only reached with CUDA tensors, which means torch is loaded already

        torch.cuda.synchronize(device)


def _is_cuda(device: Any) -> bool:
    return device is not None and str(device).startswith("cuda")


def _sync_current_stream(device: Any) -> None:
    """Wait for the kernels queued on ``device``'s current stream (a no-op off the GPU)."""
    if _is_cuda(device):
        import torch

        torch.cuda.current_stream(device).synchronize()


@dataclass(frozen=True)
class Span:
    """One interval of a rank's time: a named piece of compute, or one communication op.

    Attributes:
        name: what ran, e.g. ``"forward"`` or ``"all_reduce"``.
        kind: ``"compute"``, ``"comm"``, or another word of the user's (drawn as compute).
        start_ns: start on ``clock_ns()``.
        end_ns: end on ``clock_ns()`` (≥ ``start_ns``).
        rank: the global rank that recorded it.
        args: extra facts (bytes, dtype, participants, ...), shown in Perfetto.
    """

    name: str
    kind: str
    start_ns: int
    end_ns: int
    rank: int = 0
    args: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


_spans: list[Span] = []
_since_ns: int | None = None  # reset() time: older communication records are left out


def current_rank() -> int:
    """This process's global rank: the launcher's, else ``torch.distributed``'s, else 0."""
    from labkit.launcher._context import _current  # no torch import

    if _current is not None:
        return _current.rank
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


@contextmanager
def span(name: str, kind: str = COMPUTE, *, device: Any = None, **args: Any) -> Iterator[None]:
    """Record the time the ``with`` block takes as one span of this rank.

    Args:
        name: what the block does, e.g. ``"forward"``.
        kind: ``"compute"`` (default), ``"comm"``, or a word of your own (drawn as compute).
        device: where the block's tensors live; on a GPU the current stream is synchronised
            before each clock read, so the span covers the block's kernels and not only
            their queueing (other streams, e.g. NCCL's, are not waited for).
        **args: extra facts to keep with the span (shown in Perfetto).

    Returns:
        A context manager; the span is recorded when the block exits, even by an exception.

    Raises:
        ValueError: ``name`` or ``kind`` is empty.
    """
    if not name or not kind:
        raise ValueError(f"a span needs a name and a kind, got name={name!r}, kind={kind!r}")
    _sync_current_stream(device)
    start = clock_ns()
    try:
        yield
    finally:
        _sync_current_stream(device)
        _spans.append(Span(name, kind, start, clock_ns(), current_rank(), dict(args)))


def _comm_spans() -> list[Span]:
    """The recording backend's completed operations on this rank, as spans of kind "comm"."""
    recording = sys.modules.get("labkit.backends.recording")
    if recording is None:  # never imported: nothing was recorded
        return []
    out = []
    for r in recording.records():
        if r.end_ns is None or (_since_ns is not None and r.start_ns < _since_ns):
            continue
        args = {
            "n_bytes": r.n_bytes,
            "dtype": r.dtype,
            "participants": list(r.participants),
            "group": r.group,
        }
        args.update({k: v for k, v in (("peer", r.peer), ("root", r.root)) if v is not None})
        out.append(Span(r.op, COMM, r.start_ns, r.end_ns, r.rank, args))
    return out


def events() -> list[Span]:
    """This rank's spans since the last ``reset()``, communication included, by start time.

    Return the list from the function ``lk.launch`` runs, and give every rank's list to
    ``lk.trace.Timeline.merge``. Communication spans come from the recording backend
    (``backend="labkit_record"`` or ``lk.backends.recording.spec(...)``); operations still
    in flight are left out.

    Returns:
        list[Span]: compute spans from ``span()`` and the recorded communication ops.
    """
    return sorted(_spans + _comm_spans(), key=lambda s: (s.start_ns, s.end_ns))


def reset() -> None:
    """Forget this rank's spans so far (e.g. after a warm-up step), recorded ops included.

    The recording backend keeps its own records (``lk.backends.recording.records()``);
    ``events()`` only stops showing those that started before this call.

    Returns:
        None.
    """
    global _since_ns
    _spans.clear()
    _since_ns = clock_ns()
