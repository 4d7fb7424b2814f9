"""One optimizer step's forwards and backwards on a composed model, and a plain SGD loop.

Introduced in notebooks/18_hybrid_parallel.ipynb (accumulation and autocast: notebook 09).

``forward_backward`` is what torchtitan's trainer calls ``forward_backward_step``: with a
pipeline, the schedule runs the micro-batches; otherwise k micro-batches run one after the
other, each loss scaled by its share of the batch, every backward but the last under
``no_sync`` (notebook 09), so the gradients are reduced over dp once. When it returns every
piece's gradient is the average over the batch, reduced — ready for clipping.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from labkit.mesh import dp_shard
from labkit.parallel.accumulate import split_micro_batches
from labkit.parallel.compose.sync import no_sync
from labkit.trace import sync_device

if TYPE_CHECKING:
    from labkit.parallel.compose.parallelize import Parallelized

__all__ = ["forward_backward", "train_sgd"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def forward_backward(
    parts: Parallelized,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    microbatches: int = 1,
    context: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> float | None:
    """Forward and backward of this rank's share of one step; the gradients reduced once.

    Args:
        parts: this rank's share of the model (``parallelize``).
        x, y: this rank's share of the batch (its dp slice).
        loss_fn: the mean loss of a batch.
        microbatches: k, micro-batches of gradient accumulation (without a pipeline; a
            pipeline's micro-batches were set by ``parallelize``).
        context: entered around each forward and its loss, e.g. bf16 autocast
            (``lk.precision.autocast``); backward runs outside it.

    Returns:
        The mean loss over ``x`` (None on pipeline ranks that do not compute it).

    Raises:
        ValueError: ``microbatches`` > 1 together with a pipeline.
    """
    context = context or contextlib.nullcontext
    if parts.pipeline is not None:
        if microbatches != 1:
            raise ValueError("a pipeline runs its own micro-batches (parallelize(microbatches=))")
        loss = parts.pipeline.step(x, y, loss_fn, context)
    else:
        chunks = split_micro_batches(x, y, microbatches)
        total = torch.zeros((), device=x.device)
        for i, (xi, yi) in enumerate(chunks):
            last = i == len(chunks) - 1
            with contextlib.nullcontext() if last else no_sync(parts.reducer):
                with context():
                    part = loss_fn(parts.module(xi), yi) * (len(xi) / len(x))
                part.backward()  # the last one reduces over dp (DDP buckets, FSDP2, ZeRO-2/3)
            total += part.detach().float()
        loss = float(total)
    parts.reduce_gradients()  # ZeRO-1 reduce-scatters here, before anyone reads the gradients
    return loss


def train_sgd(
    parts: Parallelized,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    steps: int,
    lr: float,
    step_times: list[float] | None = None,
) -> list[Any]:
    """Train with plain SGD on this rank's dp share of the global batch ``(x, y)``.

    Every rank passes the same global batch; ``labkit.mesh.dp_shard`` keeps its replica's
    share. Each step: ``forward_backward``, then ``p -= lr · grad`` on every piece.

    Args:
        parts: this rank's share (any dp flavour but ZeRO, which is Adam).
        x, y: the global batch, the same on every rank.
        loss_fn: mean over the batch.
        steps: optimizer steps.
        lr: learning rate.
        step_times: if given, each step's wall time on this rank (seconds) is appended.

    Returns:
        Each step's loss on this rank's share (None on pipeline ranks without the loss).

    Raises:
        ValueError: a ZeRO flavour, or a batch the dp degree does not divide.
    """
    if parts.zero is not None:
        raise ValueError("ZeRO is an Adam optimizer: train it with parts.make_adam()")
    xs, ys = dp_shard(x, parts.dims, parts.mesh), dp_shard(y, parts.dims, parts.mesh)
    losses = []
    for _ in range(steps):
        sync_device(xs.device)  # on a GPU a step's time covers its kernels, not their queueing
        start = time.perf_counter()
        losses.append(forward_backward(parts, xs, ys, loss_fn))
        with torch.no_grad():
            for p in parts.params:
                p.add_(p.grad, alpha=-lr)
                p.grad = None
        if step_times is not None:
            sync_device(xs.device)
            step_times.append(time.perf_counter() - start)
    return losses
