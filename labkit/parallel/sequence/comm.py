"""Sequence parallelism's operators: scatter, all-gather and reduce-scatter along the sequence.

Introduced in notebooks/15_sequence_parallel.ipynb.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.2.2
and Figure 5: tensor parallelism (Shoeybi et al. 2019, §3) leaves the LayerNorms and dropouts
of a transformer layer replicated on every rank; sequence parallelism shards them along the
sequence instead, and replaces the all-reduces that join the two regions by a conjugate pair:

- ``g`` = :func:`gather_from_sequence`: all-gather along the sequence in forward (the
  column-parallel layers need the whole sequence), reduce-scatter in backward (each rank's
  gradient of the whole sequence is a partial sum; each keeps the sum over its own tokens);
- ``ḡ`` = :func:`reduce_scatter_to_sequence`: reduce-scatter in forward (the row-parallel
  layer's partial sums, each rank keeping its tokens), all-gather in backward.

A ring all-reduce *is* a reduce-scatter followed by an all-gather (Patarasuk and Yuan 2009), so
the bytes moved per layer are those of tensor parallelism; what changes is that the tensors
between the two collectives are 1/t of the sequence. :func:`scatter_to_sequence` enters the
region (keep this rank's tokens; all-gather the gradient), ``gather_from_sequence(...,
grad="split")`` leaves it.

Tensors are batch-first, (B, T, h) as in ``labkit.models``, so the sequence is dim 1 (Megatron's
are (T, B, h), sequence dim 0; DTensor's ``SequenceParallel`` defaults to ``sequence_dim=1``).
Collectives run on the tensors' own device (NCCL on GPUs): ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` concatenate along dim 0, so the sequence is moved to the front first.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

__all__ = [
    "SEQ_DIM",
    "all_gather_sequence",
    "gather_from_sequence",
    "reduce_scatter_sequence",
    "reduce_scatter_to_sequence",
    "scatter_to_sequence",
    "split_sequence",
    "start_all_gather_sequence",
    "start_reduce_scatter_sequence",
]

SEQ_DIM = 1  # (B, T, h)


def _check(t: int, p: int) -> None:
    if t % p:
        raise ValueError(f"sequence length {t} is not divisible by {p} ranks")


def split_sequence(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's equal, consecutive slice of ``x``'s sequence (dim 1); no communication.

    Args:
        x: (B, T, ...), the same on every rank of ``group``.
        group: the tensor-parallel group (None: the default group).

    Returns:
        torch.Tensor: (B, T/p, ...), tokens ``[r·T/p, (r+1)·T/p)`` for group rank r of p.

    Raises:
        ValueError: T is not divisible by p.
    """
    p, r = dist.get_world_size(group), dist.get_rank(group)
    _check(x.shape[SEQ_DIM], p)
    return x.chunk(p, dim=SEQ_DIM)[r].contiguous()


def start_all_gather_sequence(
    x: torch.Tensor, group: dist.ProcessGroup | None = None
) -> Callable[[], torch.Tensor]:
    """Start concatenating every rank's slice of the sequence (one all-gather, in flight).

    Megatron-LM overlaps this all-gather with a GEMM that does not need it; the caller does the
    same by computing between the start and the wait.

    Args:
        x: (B, T/p, ...), this rank's tokens.
        group: the tensor-parallel group (None: the default group).

    Returns:
        A function that waits for the all-gather and returns (B, T, ...), contiguous, the same
        on every rank, the ranks' slices in rank order.
    """
    if dist.get_world_size(group) == 1:
        return lambda: x
    front = x.movedim(SEQ_DIM, 0).contiguous()  # (T/p, B, ...)
    out = front.new_empty((dist.get_world_size(group) * front.shape[0], *front.shape[1:]))
    work = dist.all_gather_into_tensor(out, front, group=group, async_op=True)

    def finish() -> torch.Tensor:
        work.wait()
        return out.movedim(0, SEQ_DIM).contiguous()

    return finish


def all_gather_sequence(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate every rank's slice of the sequence, in rank order (one all-gather).

    Args:
        x: (B, T/p, ...), this rank's tokens.
        group: the tensor-parallel group (None: the default group).

    Returns:
        torch.Tensor: (B, T, ...), contiguous, the same on every rank.
    """
    return start_all_gather_sequence(x, group)()


def start_reduce_scatter_sequence(
    x: torch.Tensor, group: dist.ProcessGroup | None = None
) -> Callable[[], torch.Tensor]:
    """Start summing ``x`` over the ranks, each keeping its slice of the sequence (in flight).

    Args:
        x: (B, T, ...), this rank's partial sum of the whole sequence.
        group: the tensor-parallel group (None: the default group).

    Returns:
        A function that waits and returns (B, T/p, ...), the sum over the ranks of tokens
        ``[r·T/p, (r+1)·T/p)``.

    Raises:
        ValueError: T is not divisible by p.
    """
    p = dist.get_world_size(group)
    if p == 1:
        return lambda: x
    _check(x.shape[SEQ_DIM], p)
    front = x.movedim(SEQ_DIM, 0).contiguous()  # (T, B, ...)
    out = front.new_empty((front.shape[0] // p, *front.shape[1:]))
    work = dist.reduce_scatter_tensor(out, front, group=group, async_op=True)

    def finish() -> torch.Tensor:
        work.wait()
        return out.movedim(0, SEQ_DIM).contiguous()

    return finish


def reduce_scatter_sequence(
    x: torch.Tensor, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Sum ``x`` over the ranks and keep this rank's slice of the sequence (one reduce-scatter).

    Args:
        x: (B, T, ...), this rank's partial sum of the whole sequence.
        group: the tensor-parallel group (None: the default group).

    Returns:
        torch.Tensor: (B, T/p, ...), the sum over the ranks of tokens ``[r·T/p, (r+1)·T/p)``.

    Raises:
        ValueError: T is not divisible by p.
    """
    return start_reduce_scatter_sequence(x, group)()


class _ScatterToSequence(torch.autograd.Function):
    """Keep this rank's tokens forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return split_sequence(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_gather_sequence(grad, ctx.group), None


class _GatherFromSequence(torch.autograd.Function):
    """All-gather forward; reduce-scatter (or keep this rank's slice of) the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None, reduce: bool):
        ctx.group, ctx.reduce = group, reduce
        return all_gather_sequence(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if ctx.reduce:
            return reduce_scatter_sequence(grad, ctx.group), None, None
        return split_sequence(grad, ctx.group), None, None


class _ReduceScatterToSequence(torch.autograd.Function):
    """Reduce-scatter forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return reduce_scatter_sequence(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_gather_sequence(grad, ctx.group), None


def scatter_to_sequence(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Enter the sequence-parallel region: keep this rank's tokens; backward all-gathers.

    Megatron-LM's ``scatter_to_sequence_parallel_region``.

    Args:
        x: (B, T, h), replicated on every rank of ``group``.
        group: the tensor-parallel group (None: the default group).

    Returns:
        torch.Tensor: (B, T/p, h).

    Raises:
        ValueError: T is not divisible by p.
    """
    return _ScatterToSequence.apply(x, group)


def gather_from_sequence(
    x: torch.Tensor, group: dist.ProcessGroup | None = None, grad: str = "reduce_scatter"
) -> torch.Tensor:
    """Korthikanti's ``g``: all-gather the sequence forward; reduce-scatter the gradient backward.

    Korthikanti et al. 2022, §4.2.2, Figure 5 (Megatron-LM's
    ``gather_from_sequence_parallel_region``).

    Args:
        x: (B, T/p, h), this rank's tokens.
        group: the tensor-parallel group (None: the default group).
        grad: ``"reduce_scatter"`` when the ranks use the gathered tensor differently (it feeds
            column-parallel layers, so each rank's gradient is a partial sum: ``g``), or
            ``"split"`` when every rank uses it the same way (leaving the region before a
            replicated head: the gradient is whole on every rank, keep this rank's tokens).

    Returns:
        torch.Tensor: (B, T, h), the same on every rank.

    Raises:
        ValueError: an unknown ``grad``.
    """
    if grad not in ("reduce_scatter", "split"):
        raise ValueError(f"grad must be 'reduce_scatter' or 'split', got {grad!r}")
    return _GatherFromSequence.apply(x, group, grad == "reduce_scatter")


def reduce_scatter_to_sequence(
    x: torch.Tensor, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Korthikanti's ``ḡ``: reduce-scatter the partial sums forward; all-gather backward.

    Korthikanti et al. 2022, §4.2.2, Figure 5: replaces the all-reduce ``g`` that closes a
    tensor-parallel attention or MLP (Shoeybi et al. 2019, §3).

    Args:
        x: (B, T, h), this rank's partial sum (a row-parallel layer's output, before its bias).
        group: the tensor-parallel group (None: the default group).

    Returns:
        torch.Tensor: (B, T/p, h), the sum over the ranks of this rank's tokens.

    Raises:
        ValueError: T is not divisible by p.
    """
    return _ReduceScatterToSequence.apply(x, group)
