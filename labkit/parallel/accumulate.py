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
(one process: nothing to synchronise). With a ``torch.amp.GradScaler`` (fp16) each backward
runs on the scaled loss, and the scaler unscales before clipping, skips a step whose
gradients overflowed and updates its scale once per optimizer step.

Ranks with unequal numbers of tokens (padding, packed sequences of different lengths): DDP
averages the ranks' gradients with equal weights, so each rank's *mean* loss over its own
n_r tokens gives the gradient of (1/p) Σ_r (1/n_r) Σ_{i∈r} ℓ_i — not the per-token mean
(1/N) Σ_i ℓ_i over all N = Σ_r n_r tokens unless every n_r is equal. ``token_mean_loss``
sums the rank's token losses, all-reduces the token count and divides by N, times p to undo
DDP's average: the gradient of one process on the whole batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "accumulation_step",
    "global_token_count",
    "split_micro_batches",
    "sync_context",
    "token_mean_loss",
]

Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def sync_context(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
    """The context a backward runs in: ``model.no_sync()`` unless this backward must sync.

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
    scaler: torch.amp.GradScaler | None = None,
) -> dict[str, float]:
    """One optimizer step over k micro-batches that equals one step on their union.

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
        scaler: a ``torch.amp.GradScaler`` for fp16 (Micikevicius et al. 2018, §3.2): every
            backward runs on ``scaler.scale(loss)``, ``unscale_`` precedes the clipping, and
            ``scaler.step`` / ``scaler.update`` replace ``optimizer.step()``. None: no scaling.

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
            (loss if scaler is None else scaler.scale(loss)).backward()
        total += loss.item()
    grad_norm = float("nan")
    if max_norm is not None:  # after the last backward: the gradients are averaged already
        if scaler is not None:
            scaler.unscale_(optimizer)  # clip the true gradients, not S times them
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
    if scaler is None:
        optimizer.step()
    else:  # skipped when a gradient is inf/NaN; then the scale backs off
        scaler.step(optimizer)
        scaler.update()
    return {"loss": total, "grad_norm": grad_norm}


def global_token_count(
    n_tokens: int, group: dist.ProcessGroup | None = None, device: torch.device | str = "cpu"
) -> int:
    """The number of tokens over all ranks of ``group``: an all-reduce (SUM) of the counts.

    Args:
        n_tokens: tokens that count in this rank's loss (padding excluded).
        group: the data-parallel group (None: the default group).
        device: where the count travels: ``"cuda"`` under NCCL, ``"cpu"`` under gloo.

    Returns:
        N = Σ_r n_r, the same on every rank.
    """
    count = torch.tensor([n_tokens], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.SUM, group=group)
    return int(count.item())


def token_mean_loss(loss_sum: torch.Tensor, n_global: int, world_size: int) -> torch.Tensor:
    """This rank's share of the global per-token mean, ready for DDP's gradient average.

    DDP divides the summed gradients by p (``world_size``), so the rank's loss is
    p · Σ_{i∈r} ℓ_i / N: the averaged gradient is then (1/N) Σ_i ∇ℓ_i, the gradient of one
    process on all N tokens. (The rank's own mean, Σ_{i∈r} ℓ_i / n_r, weights each rank
    equally instead of each token.)

    Args:
        loss_sum: Σ ℓ_i over this rank's tokens, e.g. ``cross_entropy(..., reduction="sum")``
            (with ``ignore_index`` for padding).
        n_global: tokens over all ranks, ``global_token_count(n_r, group)``.
        world_size: ranks that DDP averages over.

    Returns:
        The scalar loss to call ``backward()`` on.

    Raises:
        ValueError: ``n_global`` or ``world_size`` is not positive.
    """
    if n_global <= 0 or world_size <= 0:
        raise ValueError(f"need n_global > 0 and world_size > 0, got {n_global}, {world_size}")
    return loss_sum * (world_size / n_global)
