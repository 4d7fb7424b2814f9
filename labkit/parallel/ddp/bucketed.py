"""``DataParallelBucketed``: size-capped buckets all-reduced during backward, and ``no_sync``.

Introduced in notebooks/07_ddp_buckets_and_overlap.ipynb; ``no_sync`` (gradient accumulation)
and ``reduce_gradients`` come with notebooks/09_accumulation_and_precision.ipynb and
notebooks/18_hybrid_parallel.ipynb (a pipeline stage's reduction).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from labkit.parallel.ddp.buckets import assign_buckets
from labkit.parallel.ddp.naive import broadcast_state, queue_at_end_of_backward

__all__ = ["DataParallelBucketed"]


@dataclass
class _Bucket:
    """One flat gradient buffer and the parameters whose gradients are views into it."""

    names: list[str]
    params: list[nn.Parameter]
    buffer: torch.Tensor  # (sum of numels,) in the bucket's dtype
    views: list[torch.Tensor]  # views[i] is buffer's slice shaped like params[i]
    pending: int = 0  # gradients still to arrive in this backward
    ready: list[bool] = field(default_factory=list)
    work: dist.Work | None = None


class DataParallelBucketed(nn.Module):
    """Data parallelism with gradient buckets reduced while backward is still running.

    Implements the design of Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data
    Parallel Training" (§3.2.3 bucketing, overlap; §3.2.4 ``no_sync``).

    At construction the parameters and buffers are broadcast from the group's first rank
    and the parameters that require gradients are assigned to buckets (``assign_buckets``:
    reverse registration order, ``bucket_cap_mb`` cap). Each bucket owns one flat buffer;
    after a parameter's gradient is accumulated, a post-accumulate-grad hook copies it into
    its slice of the buffer (no copy when ``.grad`` already is that slice, as after
    ``zero_grad(set_to_none=False)``) and points ``.grad`` at the slice — torch DDP's
    ``gradient_as_bucket_view=True``. When the last gradient of a bucket has arrived, and
    every earlier bucket has been launched (all ranks must issue the same collectives in
    the same order), the buffer is divided by the world size and all-reduced (SUM) with
    ``async_op=True``, so communication overlaps the rest of backward.

    How backward waits: the first hook of a backward pass queues a callback on the
    autograd engine (``queue_at_end_of_backward``). It runs after the last gradient, before
    ``loss.backward()`` returns: it launches any bucket not launched yet, waits for every
    bucket's all-reduce, and leaves each ``.grad`` holding the average over ranks.

    Parameters with ``requires_grad=False`` are in no bucket and left alone. A parameter
    without a gradient at the end of backward (unused on this rank) contributes zeros, and
    its ``.grad`` becomes the average (zeros if no rank used it), like torch DDP with
    ``find_unused_parameters=True`` but without its extra pass over the graph.

    Args:
        module: the model replica on this rank (``.module`` afterwards).
        group: the data-parallel group (None: the default group).
        bucket_cap_mb: bucket size cap in MiB, as torch DDP's argument of that name.
        overlap: False: the no-overlap baseline — same buckets, collectives and results, but
            the buckets are all-reduced one after the other (each waited for before the next
            starts) once backward has finished, so no transfer overlaps computation or
            another transfer.

    Raises:
        ValueError: if ``bucket_cap_mb`` is not positive.
    """

    def __init__(
        self,
        module: nn.Module,
        group: dist.ProcessGroup | None = None,
        bucket_cap_mb: float = 25.0,
        overlap: bool = True,
    ) -> None:
        super().__init__()
        self.module = module
        self.group = group
        self.bucket_cap_mb = bucket_cap_mb
        self.overlap = overlap
        self.world_size = dist.get_world_size(group)
        broadcast_state(module, group)
        named = dict(module.named_parameters())
        self._buckets = [
            self._make_bucket(names, named) for names in assign_buckets(module, bucket_cap_mb)
        ]
        self._where: dict[nn.Parameter, tuple[_Bucket, int]] = {}
        for b in self._buckets:
            for i, p in enumerate(b.params):
                self._where[p] = (b, i)
                p.register_post_accumulate_grad_hook(self._grad_ready)
        self._sync = True
        self._in_backward = False
        self._next = 0  # index of the next bucket to launch
        self._reset()

    @property
    def buckets(self) -> list[list[str]]:
        """The buckets, each a list of parameter names in the order they are reduced."""
        return [list(b.names) for b in self._buckets]

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside this block backward only accumulates gradients locally; no communication.

        The first backward after the block all-reduces the accumulated gradients (one round per k
        micro-steps).

        Returns:
            A context manager.
        """
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def reduce_gradients(self) -> None:
        """All-reduce now, bucket by bucket, the gradients accumulated under ``no_sync()``.

        For a model whose backward runs several times per step with no backward left to
        trigger the reduction: a pipeline stage runs one backward per micro-batch inside the
        schedule (``labkit.parallel.compose.PipelineStage``), all under ``no_sync()``, then
        calls this once — one round of bucket all-reduces per step, as torch's pipelining
        schedules hold DDP's reduction until the last micro-batch. A parameter without a
        gradient contributes zeros, as in backward.
        """
        self._finish()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._in_backward:  # a backward that raised half-way: drop its state
            self._finish(wait_only=True)
        return self.module(*args, **kwargs)

    @staticmethod
    def _make_bucket(names: list[str], named: dict[str, nn.Parameter]) -> _Bucket:
        params = [named[n] for n in names]
        buffer = torch.zeros(
            sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device
        )
        views, offset = [], 0
        for p in params:
            views.append(buffer[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return _Bucket(names, params, buffer, views)

    def _reset(self) -> None:
        self._next = 0
        for b in self._buckets:
            b.pending, b.ready, b.work = len(b.params), [False] * len(b.params), None

    @torch.no_grad()
    def _to_view(self, b: _Bucket, i: int) -> None:
        p, view = b.params[i], b.views[i]
        if p.grad is None:  # unused on this rank: contributes zeros
            view.zero_()
        elif p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)
        p.grad = view

    def _grad_ready(self, param: torch.Tensor) -> None:
        if not self._sync:
            return
        if not self._in_backward:
            self._in_backward = True
            queue_at_end_of_backward(self._finish)
        b, i = self._where[param]
        if b.ready[i]:  # hook ran twice in one backward (reentrant checkpointing)
            return
        self._to_view(b, i)
        b.ready[i] = True
        b.pending -= 1
        if self.overlap:
            self._launch_ready()

    def _launch(self, b: _Bucket) -> None:
        b.buffer.div_(self.world_size)  # divide first, as torch DDP's allreduce_hook does
        b.work = dist.all_reduce(b.buffer, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def _launch_ready(self) -> None:
        # In bucket order only: every rank must issue the same all-reduces in the same order.
        while self._next < len(self._buckets) and self._buckets[self._next].pending == 0:
            self._launch(self._buckets[self._next])
            self._next += 1

    @torch.no_grad()
    def _finish(self, wait_only: bool = False) -> None:
        try:
            if not wait_only:
                for b in self._buckets[self._next :]:
                    for i, done in enumerate(b.ready):
                        if not done:
                            self._to_view(b, i)
                    self._launch(b)
                    if not self.overlap:  # the baseline: nothing runs alongside a transfer
                        b.work.wait()
                self._next = len(self._buckets)
            for b in self._buckets:
                if b.work is not None:
                    b.work.wait()
        finally:
            self._in_backward = False
            self._reset()
