"""The ``labkit_record`` backend: wraps any backend and records every operation, results unchanged.

Introduced in notebooks/04_custom_backend.ipynb.

Importing this module registers ``"labkit_record"`` with ``torch.distributed`` (its inner
backend is named by the environment variable ``LABKIT_RECORD_INNER``, default ``gloo``), so::

    lk.launch(fn, backend="labkit_record")                               # over gloo
    lk.launch(fn, backend=lk.backends.recording.spec("labkit_shm"))      # over shared memory

Inside a rank, ``records()`` lists what this rank did — op name (torch.distributed's: all_reduce,
broadcast, all_gather_into_tensor, send, ...), bytes (as nccl-tests counts them), dtype, the
global ranks taking part, start and end on ``lk.trace.clock_ns()`` (end = when its Work
completed) — and ``lk.trace.events()`` shows them as communication spans. Each operation goes
to the inner group unchanged and the caller gets the inner group's own Work, so every tensor
is bit-for-bit what the inner backend computes. Works without a future (gloo's send and recv)
are wrapped, and their end is when the caller's ``wait()`` returned.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch.distributed as dist

from labkit.backends._inner import inner_group, register_wrapper, wrapper_spec
from labkit.backends._opcall import OpCall, when_complete
from labkit.backends._wrapper import WrapperProcessGroup
from labkit.launcher import BackendSpec
from labkit.trace.spans import clock_ns

BACKEND_NAME = "labkit_record"
INNER_ENV = "LABKIT_RECORD_INNER"


@dataclass
class OpRecord:
    """One operation this rank issued through a recording group.

    Attributes:
        op: torch.distributed's name ("all_reduce", "broadcast", "send", ...).
        n_bytes: size as nccl-tests counts it (``labkit.backends._opcall.OpCall``).
        dtype: element type, e.g. "float32" ("" for a barrier).
        participants: global ranks taking part (the group; (src, dst) for send/recv).
        start_ns: ``lk.trace.clock_ns()`` when the op was called.
        end_ns: when its Work completed (None while in flight).
        rank: this rank (global).
        group: the name torch gave the group ("0" for the default group).
        peer: the other end of a send/recv (global), root: of a rooted collective (global).
        reduce_op: "SUM", "AVG", ... for reductions.
        seq: issue order on this rank (0, 1, ...; not reused after ``clear()``).
    """

    op: str
    n_bytes: int
    dtype: str
    participants: tuple[int, ...]
    start_ns: int
    end_ns: int | None
    rank: int
    group: str
    peer: int | None = None
    root: int | None = None
    reduce_op: str | None = None
    seq: int = 0

    @property
    def duration_s(self) -> float | None:
        return None if self.end_ns is None else (self.end_ns - self.start_ns) / 1e9


_records: list[OpRecord] = []  # this process (= this rank), every recording group
_seq = itertools.count()
# Ops whose completion callback has not run yet: seq -> the inner Work. A callback needs the
# GIL, so it can run a little after the op completed (while this thread runs Python).
_in_flight: dict[int, dist.Work] = {}
SETTLE_S = 0.2  # records() waits at most this long for callbacks of completed ops


class RecordingProcessGroup(WrapperProcessGroup):
    """A ``WrapperProcessGroup`` whose ``after_op`` appends an ``OpRecord`` per operation.

    Args:
        inner: the process group that does the work.
        global_ranks: global rank of each rank of the group.
    """

    backend_name = BACKEND_NAME

    def after_op(self, call: OpCall, work: dist.Work) -> dist.Work:
        rec = OpRecord(
            op=call.op,
            n_bytes=call.n_bytes,
            dtype=call.dtype,
            participants=tuple(call.participants),
            start_ns=call.start_ns,
            end_ns=None,
            rank=self.global_ranks[self.rank()],
            group=self._group_name or "",
            peer=call.peer,
            root=call.root,
            reduce_op=call.reduce_op,
            seq=next(_seq),
        )
        _records.append(rec)
        _in_flight[rec.seq] = inner_work = work

        def done() -> None:
            rec.end_ns = clock_ns()
            _in_flight.pop(rec.seq, None)
            if call.method == "recv_anysource":  # the source is known only now
                try:
                    rec.peer = self.global_ranks[inner_work._source_rank()]
                    rec.participants = (rec.peer, rec.rank)
                except RuntimeError:
                    pass

        return when_complete(work, done)


def _create(opts, backend_options=None, inner: str | BackendSpec | None = None):
    """Creator for ``register_backend(..., extended_api=True)``: wrap a new inner group."""
    inner = inner if inner is not None else os.environ.get(INNER_ENV, "gloo")
    pg, ranks = inner_group(inner, opts)
    return RecordingProcessGroup(pg, ranks)


def spec(inner: str | BackendSpec = "gloo") -> BackendSpec:
    """A backend that records every operation and runs it on ``inner``.

    Args:
        inner: ``"gloo"`` (default), ``"nccl"``, ``"labkit_shm"`` (or another labkit backend),
            or an ``lk.BackendSpec`` (e.g. a backend written in a notebook).

    Returns:
        lk.BackendSpec: named ``labkit_record_<inner>``, for ``lk.launch(fn, backend=...)``.

    Raises:
        ValueError: ``inner`` is not a name or a BackendSpec.
    """
    return wrapper_spec(BACKEND_NAME, inner, _create)


def records(group: dist.ProcessGroup | str | None = None) -> list[OpRecord]:
    """This rank's recorded operations, in the order they were issued (copies).

    Args:
        group: only this group's operations (a group or its name); default: every recording
            group of this rank.

    Returns:
        list[OpRecord]: one row per operation; ``end_ns`` is None while one is in flight.

    Raises:
        ValueError: ``group`` is a process group that does not record.
    """
    if isinstance(group, dist.ProcessGroup):
        if not isinstance(group, RecordingProcessGroup):
            raise ValueError(
                f"{group!r} does not record: launch with backend='labkit_record' or "
                "lk.backends.recording.spec(...)"
            )
        group = group.group_name
    _settle()
    return [replace(r) for r in _records if group is None or r.group == group]


def _completed(work: dist.Work) -> bool:
    try:
        return work.get_future().done()
    except RuntimeError:  # no future (gloo send/recv): its end is set when wait() returns
        return False


def _settle() -> None:
    """Let the completion callbacks of ops that have already completed run (they wait for
    the GIL this thread holds), so a step's last op is not reported as still in flight."""
    deadline = time.monotonic() + SETTLE_S
    while any(_completed(w) for w in list(_in_flight.values())):
        if time.monotonic() > deadline:
            break
        time.sleep(1e-4)


def clear() -> None:
    """Forget this rank's records so far (e.g. after a warm-up step).

    Returns:
        None.
    """
    _records.clear()
    _in_flight.clear()


def summarize(rows: Iterable[OpRecord]) -> dict[str, dict[str, float]]:
    """Count, bytes and time per op name: ``{"all_reduce": {"count": 2, "n_bytes": ..., ...}}``.

    Args:
        rows: records, e.g. ``records()``.

    Returns:
        dict: per op (sorted by name) ``count``, ``n_bytes`` (sum) and ``time_s`` (sum of
        completed durations).
    """
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        row = out.setdefault(r.op, {"count": 0, "n_bytes": 0, "time_s": 0.0})
        row["count"] += 1
        row["n_bytes"] += r.n_bytes
        row["time_s"] += r.duration_s or 0.0
    return dict(sorted(out.items()))


register_wrapper(BACKEND_NAME, _create, INNER_ENV)
