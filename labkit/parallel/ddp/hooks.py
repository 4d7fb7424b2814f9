"""DDP communication hooks that issue collectives from callbacks, made safe on CPU backends.

Introduced in notebooks/07_ddp_buckets_and_overlap.ipynb.

Collectives pair up by the order each rank issues them, so every rank must issue them in the
same order. torch's ``powerSGD_hook`` issues a bucket's P and Q all-reduces from callbacks on
the bucket's first all-reduce (``fut.then(...)``). On NCCL a Work's future is complete once
the kernel is queued, so the callbacks run inline, inside the hook, in bucket order. On gloo,
and on labkit's backends over it (``labkit_simnet``, ``labkit_simlink``), the future
completes on another thread when the data has arrived: with more than one bucket in flight,
each rank's callbacks issue bucket *b*'s P and Q at moments set by timing, interleaved
differently with the next bucket's all-reduce that backward issues meanwhile. The ranks then
pair different collectives: gloo aborts on the size mismatch ("Received data size doesn't
match expected size") or a rank waits until the timeout.

``in_bucket_order(hook)`` lets bucket *b* start only once bucket *b − 1*'s future has
completed, so every rank issues ``A0 P0 Q0 A1 P1 Q1 ...`` (A: the bucket's own all-reduce):
one bucket's communication still overlaps the backward computation before the next bucket
is ready, but two buckets' never overlap each other.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["in_bucket_order"]

Hook = Callable[[Any, Any], torch.futures.Future]


def in_bucket_order(hook: Hook) -> Hook:
    """``hook`` run one bucket at a time: each call first waits for the previous call's future.

    Args:
        hook: a DDP communication hook ``hook(state, bucket) -> Future``, e.g.
            ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook``.

    Returns:
        A hook with the same signature, for ``ddp.register_comm_hook(state, ...)``. Register a
        fresh one per DDP model.
    """
    previous: list[torch.futures.Future | None] = [None]
    lock = threading.Lock()

    @functools.wraps(hook)
    def ordered(state: Any, bucket: Any) -> torch.futures.Future:
        with lock:  # DDP calls hooks from the autograd thread; the lock makes it explicit
            if previous[0] is not None:
                previous[0].wait()  # raises the previous bucket's error, if it had one
            fut = hook(state, bucket)
            previous[0] = fut
            return fut

    return ordered
