"""Gradient accumulation under any data-parallel flavour: reduce once per optimizer step.

Introduced in notebooks/21_capstone.ipynb (accumulation with ``no_sync`` is notebook 09's).

Every flavour reduces the gradients while backward runs, so a loop of k micro-batches must
hold the reduction back for all but the last (``no_sync``), or the collectives run k times:

- DDP (labkit's ``DataParallelBucketed``, torch's ``DistributedDataParallel``): ``no_sync()``;
- FSDP2: ``set_requires_gradient_sync(False)``: full gradients accumulate unsharded;
- ZeRO-2/3: ``ZeroBase.no_sync()``: full gradients accumulate, the last backward
  reduce-scatters them; ZeRO-1 reduces in ``step()`` anyway;
- tensor parallelism alone has nothing to hold back (its all-reduces carry activations of
  each micro-batch, which the forward and backward need).

``reduce_gradients`` finishes what backward does not: ZeRO-1's reduce-scatter (before the
gradients can be clipped), and DDP's buckets for a pipeline stage, whose every backward runs
under ``no_sync`` inside the schedule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["no_sync", "reduce_gradients"]


@contextlib.contextmanager
def no_sync(reducer: Any) -> Iterator[None]:
    """Inside the block, backward accumulates gradients locally: no data-parallel collective.

    Args:
        reducer: what reduces the gradients: a DDP wrapper, an FSDP2 module, a ZeRO stage,
            or any other module (nothing to hold back).

    Returns:
        A context manager.
    """
    if hasattr(reducer, "set_requires_gradient_sync"):  # FSDP2's FSDPModule
        reducer.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            reducer.set_requires_gradient_sync(True)
    elif hasattr(reducer, "no_sync"):  # DDP (labkit's or torch's), ZeRO
        with reducer.no_sync():
            yield
    else:
        yield


def reduce_gradients(reducer: Any) -> None:
    """Reduce now what backward left unreduced: ZeRO's shard gradients, a stage's DDP buckets.

    Call it once per optimizer step after the last backward, when that backward ran under
    ``no_sync`` (a pipeline stage's micro-batches), or on a ZeRO stage (stage 1
    reduce-scatters here; stages 2 and 3 check that backward did). On a DDP wrapper whose
    last backward synchronised it would all-reduce a second time.

    Args:
        reducer: as ``no_sync``; a module without ``reduce_gradients`` is left alone.

    Returns:
        None.
    """
    reduce = getattr(reducer, "reduce_gradients", None)
    if reduce is not None:
        reduce()
