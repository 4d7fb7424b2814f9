"""Gradient accumulation done right: k micro-batches, one all-reduce round, one optimizer step.

Introduced in notebooks/09_accumulation_and_precision.ipynb.

A global batch too large for memory is split into k micro-batches per rank. The step that
equals the large-batch step (Goyal et al. 2017, "Accurate, Large Minibatch SGD", §2.1, and
PyTorch's DDP notes on ``no_sync``):

1. zero the gradients once, before the first micro-batch (not before each one);
2. scale each micro-batch's mean loss by its share of the rank's samples (1/k for equal
   micro-batches), so the summed gradients are the gradient of the mean over the rank's batch;
3. run every backward but the last inside ``model.no_sync()``: gradients accumulate locally,
   and only the last backward all-reduces (one round of buckets per step instead of k);
4. clip after the last backward — the all-reduce has averaged the gradients by then, so
   every rank clips the same global gradient, as a single process would;
5. one ``optimizer.step()``.

Works with ``torch.nn.parallel.DistributedDataParallel``, labkit's
``DataParallelNaive``/``DataParallelBucketed`` (both offer ``no_sync()``), and a plain module
(one process: nothing to synchronise).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["accumulation_step", "split_micro_batches", "sync_context"]

Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def sync_context(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
    """The context a backward runs in: ``model.no_sync()`` unless this backward must sync.

    Introduced in notebooks/09_accumulation_and_precision.ipynb.

    Args:
        model: a data-parallel wrapper with ``no_sync()`` (PyTorch DDP, labkit's DDP) or any
            module without it (one process: every backward is local anyway).
        sync: True for the backward whose gradients must be all-reduced (the last one).

    Returns:
        A context manager: ``model.no_sync()`` when ``sync`` is False and the model has one,
        else a ``contextlib.nullcontext()``.
    """
    no_sync = getattr(model, "no_sync", None)
    if sync or no_sync is None:
        return contextlib.nullcontext()
    return no_sync()


def split_micro_batches(x: torch.Tensor, y: torch.Tensor, k: int) -> list[Batch]:
    """Cut a rank's batch into ``k`` micro-batches of (nearly) equal size, in order.

    Introduced in notebooks/09_accumulation_and_precision.ipynb.

    Args:
        x: inputs, (B, ...).
        y: targets, (B, ...).
        k: number of micro-batches, 1 ≤ k ≤ B.

    Returns:
        list of ``(x_i, y_i)``: ``torch.tensor_split`` along the batch dimension.

    Raises:
        ValueError: ``k`` is not in 1..B, or x and y differ in length.
    """
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length: {len(x)} vs {len(y)}")
    if not 1 <= k <= len(x):
        raise ValueError(f"need 1 <= k <= batch size ({len(x)}), got k={k}")
    return list(zip(torch.tensor_split(x, k), torch.tensor_split(y, k), strict=True))


def accumulation_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[Batch],
    loss_fn: LossFn,
    max_norm: float | None = None,
) -> dict[str, float]:
    """One optimizer step over k micro-batches that equals one step on their union.

    Introduced in notebooks/09_accumulation_and_precision.ipynb.

    Zeroes the gradients once, runs each micro-batch's forward and backward with its mean loss
    scaled by n_i / N (N = samples in all micro-batches; 1/k when they are equal), inside
    ``model.no_sync()`` for all but the last, clips the (all-reduced) gradient norm to
    ``max_norm`` when given, and steps the optimizer once. ``loss_fn`` must return the *mean*
    loss of a micro-batch (PyTorch's default reduction). Under data parallelism every rank must
    pass micro-batches of the same sizes: DDP averages over ranks with equal weights.

    Args:
        model: the (wrapped) model, e.g. ``DistributedDataParallel(module)``.
        optimizer: the optimizer over the model's parameters.
        micro_batches: ``[(x_1, y_1), ..., (x_k, y_k)]`` of this rank, k ≥ 1.
        loss_fn: ``loss_fn(output, target)`` → mean loss of the micro-batch.
        max_norm: clip the global gradient 2-norm to this after the all-reduce (None: no
            clipping).

    Returns:
        dict with ``loss`` (this rank's mean loss over its N samples, before the step) and
        ``grad_norm`` (the gradient's 2-norm before clipping; NaN when ``max_norm`` is None).

    Raises:
        ValueError: no micro-batches.
    """
    if not micro_batches:
        raise ValueError("need at least one micro-batch")
    n_total = sum(len(x) for x, _ in micro_batches)
    optimizer.zero_grad(set_to_none=True)  # once per step: backward() adds into .grad
    total = 0.0
    last = len(micro_batches) - 1
    for i, (x, y) in enumerate(micro_batches):
        with sync_context(model, sync=i == last):
            loss = loss_fn(model(x), y) * (len(x) / n_total)  # share of the rank's mean
            loss.backward()
        total += loss.item()
    grad_norm = float("nan")
    if max_norm is not None:  # after the last backward: the gradients are averaged already
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
    optimizer.step()
    return {"loss": total, "grad_norm": grad_norm}
