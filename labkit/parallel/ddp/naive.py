"""``DataParallelNaive``: one all-reduce per parameter after backward.

Introduced in notebooks/06_data_parallel.ipynb; ``queue_at_end_of_backward`` is
notebooks/07_ddp_buckets_and_overlap.ipynb's (the bucketed DDP finishes its reduction with it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DataParallelNaive", "broadcast_state", "queue_at_end_of_backward"]


def broadcast_state(module: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Copy ``module``'s parameters and buffers from the group's first rank to every rank.

    DDP does the same at construction (Li et al. 2020, §3.2.1), so replicas start identical even if
    their seeds differed.

    Args:
        module: the replica on this rank; its tensors are overwritten in place.
        group: the data-parallel group (None: the default group).

    Returns:
        None.
    """
    src = dist.get_process_group_ranks(group)[0] if group is not None else 0
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=src, group=group)


def queue_at_end_of_backward(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the autograd engine has finished the current backward pass.

    Must be called while a backward pass runs (e.g. from a gradient hook); this is how PyTorch's own
    FSDP and DDP (``Reducer::autograd_hook`` → ``queue_callback``) finish their communication before
    ``backward()`` returns, so the caller needs no extra call.

    Args:
        callback: a function of no arguments.

    Returns:
        None.
    """
    torch.autograd.Variable._execution_engine.queue_callback(callback)


class DataParallelNaive(nn.Module):
    """Data parallelism in its simplest form: average each gradient with its own all-reduce.

    At construction the parameters and buffers are broadcast from the group's first rank.
    Each parameter that requires a gradient gets a post-accumulate-grad hook; the first hook
    of a backward pass queues a callback on the autograd engine, which runs when backward
    is done and, for every such parameter in registration order, all-reduces (SUM) its
    ``.grad`` and divides it by the world size — one blocking all-reduce per parameter, so
    nothing overlaps (``DataParallelBucketed`` fixes both). ``loss.backward()`` returns
    with averaged gradients; no extra call is needed.

    Parameters with ``requires_grad=False`` are left alone. A parameter that got no
    gradient on this rank in a step (unused in its forward) contributes zeros, and its
    ``.grad`` becomes the average over ranks (zeros if no rank used it) — every rank must
    issue the same all-reduces in the same order.

    Args:
        module: the model replica on this rank (``.module`` afterwards).
        group: the data-parallel group (None: the default group).
    """

    def __init__(self, module: nn.Module, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        broadcast_state(module, group)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._queued = False
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._queued = False  # a backward that raised half-way must not block the next one
        return self.module(*args, **kwargs)

    def _grad_ready(self, param: torch.Tensor) -> None:
        if not self._queued:
            self._queued = True
            queue_at_end_of_backward(self._average_gradients)

    @torch.no_grad()
    def _average_gradients(self) -> None:
        self._queued = False
        for p in self._params:
            if p.grad is None:  # unused on this rank: its share of the sum is zero
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=self.group)
            p.grad.div_(self.world_size)
