"""The conjugate communication operators of tensor parallelism, as autograd functions.

Introduced in notebooks/12_tensor_parallel.ipynb.

Megatron-LM (Shoeybi et al. 2019, §3, Figure 3 and its code listing) makes a block
tensor-parallel with two operators that are each other's transpose:

- ``f`` = :func:`copy_to_parallel`: identity in forward, all-reduce of the gradient in backward
  (every rank used the same input, so the input's gradient is the sum of the ranks' parts);
- ``g`` = :func:`reduce_from_parallel`: all-reduce in forward (sum the ranks' partial outputs),
  identity in backward (the summed output's gradient reaches every rank unchanged).

Plus a gather/split pair along the last dimension for column-parallel outputs that must be
whole again. How tensors move lives here; what the layers compute lives in ``layers.py``
(picotron's ``tp_communications.py`` / ``tensor_parallel.py`` split).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = [
    "copy_to_parallel",
    "gather_from_parallel",
    "reduce_from_parallel",
    "split_to_parallel",
]


def _all_reduce(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    if dist.get_world_size(group) == 1:
        return x
    x = x.contiguous().clone()
    dist.all_reduce(x, group=group)
    return x


def _split_last(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    p, r = dist.get_world_size(group), dist.get_rank(group)
    if x.shape[-1] % p:
        raise ValueError(f"last dimension {x.shape[-1]} is not divisible by {p} ranks")
    return x.chunk(p, dim=-1)[r].contiguous()


def _gather_last(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    p = dist.get_world_size(group)
    if p == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(p)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


class _CopyToParallel(torch.autograd.Function):
    """f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad, ctx.group), None


class _ReduceFromParallel(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromParallel(torch.autograd.Function):
    """All-gather along the last dimension forward, keep this rank's slice backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return _gather_last(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _split_last(grad, ctx.group), None


class _SplitToParallel(torch.autograd.Function):
    """Keep this rank's slice of the last dimension forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return _split_last(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _gather_last(grad, ctx.group), None


def copy_to_parallel(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Megatron's ``f``: pass ``x`` on unchanged; all-reduce its gradient in backward.

    Shoeybi et al. 2019, §3, Figure 3.

    Args:
        x: a tensor replicated on every rank of ``group`` (the input of a column-parallel layer).
        group: the tensor-parallel group (None: the default group).

    Returns:
        torch.Tensor: ``x`` itself (as a view), whose backward sums the ranks' gradients.
    """
    return _CopyToParallel.apply(x, group)


def reduce_from_parallel(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Megatron's ``g``: all-reduce the ranks' partial sums in forward; identity in backward.

    Shoeybi et al. 2019, §3, Figure 3.

    Args:
        x: this rank's partial output (e.g. of a row-parallel layer).
        group: the tensor-parallel group (None: the default group).

    Returns:
        torch.Tensor: the sum over the group's ranks, the same on every rank.
    """
    return _ReduceFromParallel.apply(x, group)


def gather_from_parallel(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate every rank's ``x`` along the last dimension; backward keeps this rank's slice.

    What ``gather_output=True`` of a column-parallel layer does.

    Args:
        x: this rank's slice of the last dimension, same shape on every rank.
        group: the tensor-parallel group (None: the default group).

    Returns:
        torch.Tensor: the whole tensor, last dimension ``p`` times ``x``'s.
    """
    return _GatherFromParallel.apply(x, group)


def split_to_parallel(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's equal slice of ``x``'s last dimension; backward all-gathers the gradient.

    What ``input_is_parallel=False`` of a row-parallel layer does.

    Args:
        x: a tensor replicated on every rank of ``group``.
        group: the tensor-parallel group (None: the default group).

    Returns:
        torch.Tensor: slice ``rank`` of ``p`` equal slices of the last dimension.

    Raises:
        ValueError: the last dimension is not divisible by the group size.
    """
    return _SplitToParallel.apply(x, group)
