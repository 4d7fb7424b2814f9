"""Column- and row-parallel linear layers, built by sharding an existing ``nn.Linear``.

Introduced in notebooks/12_tensor_parallel.ipynb.

A linear layer ``Y = X Wᵀ + b`` with ``W`` of shape (out, in) splits two ways (Megatron-LM,
Shoeybi et al. 2019, §3):

- **column-parallel**: rank r keeps rows ``[r·out/p, (r+1)·out/p)`` of ``W`` (columns of
  ``Wᵀ``, hence the name) and the same slice of ``b``; from the whole input it computes its
  slice of the output's last dimension. No communication forward; ``f`` all-reduces the
  input's gradient backward.
- **row-parallel**: rank r keeps columns ``[r·in/p, (r+1)·in/p)`` of ``W``; from its slice of
  the input it computes a partial sum of the whole output; ``g`` all-reduces the partial sums
  forward, then adds the (replicated) bias once.

Both start from the unsplit layer's weights, so the sharded model computes exactly what the
unsplit one does, and each shard's gradient is the matching slice of the unsplit gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit.parallel.tensor.comm import (
    copy_to_parallel,
    gather_from_parallel,
    reduce_from_parallel,
    split_to_parallel,
)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "shard_range"]


def shard_range(size: int, group: dist.ProcessGroup | None = None) -> slice:
    """This rank's slice of ``size`` items split into equal consecutive shards.

    Args:
        size: the dimension to split (output features, input features, heads, ...).
        group: the tensor-parallel group (None: the default group).

    Returns:
        slice: ``[r·size/p, (r+1)·size/p)`` for group rank r of p.

    Raises:
        ValueError: ``size`` is not divisible by the group size (Megatron requires it too).
    """
    p, r = dist.get_world_size(group), dist.get_rank(group)
    if size % p:
        raise ValueError(f"cannot split {size} features into {p} equal shards ({size} % {p} != 0)")
    n = size // p
    return slice(r * n, (r + 1) * n)


class ColumnParallelLinear(nn.Module):
    """This rank's shard of ``linear``'s output features: ``Y_r = f(X) W_rᵀ + b_r``.

    Shoeybi et al. 2019, §3, Figure 3a: the first GEMM of the MLP, ``A = [A_1, A_2]``.

    Args:
        linear: the unsplit layer; its weights are copied (sliced), it is left unchanged.
        group: the tensor-parallel group (None: the default group).
        gather_output: all-gather the output slices into the whole output (default: keep the
            slice, ready for a row-parallel layer).

    Attributes:
        weight: (out/p, in), bias: (out/p,) or None, rows: the slice of the unsplit rows.

    Raises:
        ValueError: out_features not divisible by the group size.
    """

    def __init__(
        self,
        linear: nn.Linear,
        group: dist.ProcessGroup | None = None,
        gather_output: bool = False,
    ) -> None:
        super().__init__()
        self.group, self.gather_output = group, gather_output
        self.in_features, self.full_out_features = linear.in_features, linear.out_features
        self.rows = shard_range(linear.out_features, group)
        self.weight = nn.Parameter(linear.weight.detach()[self.rows].clone())
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach()[self.rows].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(copy_to_parallel(x, self.group), self.weight, self.bias)  # (..., out/p)
        return gather_from_parallel(y, self.group) if self.gather_output else y

    def extra_repr(self) -> str:
        return (
            f"in={self.in_features}, out={self.full_out_features} → rows {self.rows.start}:"
            f"{self.rows.stop}, gather_output={self.gather_output}"
        )


class RowParallelLinear(nn.Module):
    """This rank's shard of ``linear``'s input features: ``Y = g(X_r W_rᵀ) + b``.

    Shoeybi et al. 2019, §3, Figure 3a: the second GEMM of the MLP, ``B = [B_1; B_2]``,
    followed by the all-reduce ``g``.

    Args:
        linear: the unsplit layer; its weights are copied (sliced), it is left unchanged.
        group: the tensor-parallel group (None: the default group).
        input_is_parallel: the input is already this rank's slice of the last dimension (the
            output of a column-parallel layer); if False the whole input is given and split.

    Attributes:
        weight: (out, in/p), bias: (out,) replicated on every rank, added after the
        all-reduce so it is counted once; cols: the slice of the unsplit columns.

    Raises:
        ValueError: in_features not divisible by the group size.
    """

    def __init__(
        self,
        linear: nn.Linear,
        group: dist.ProcessGroup | None = None,
        input_is_parallel: bool = True,
    ) -> None:
        super().__init__()
        self.group, self.input_is_parallel = group, input_is_parallel
        self.full_in_features, self.out_features = linear.in_features, linear.out_features
        self.cols = shard_range(linear.in_features, group)
        self.weight = nn.Parameter(linear.weight.detach()[:, self.cols].clone())
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = split_to_parallel(x, self.group)
        y = reduce_from_parallel(F.linear(x, self.weight), self.group)  # (..., out), summed
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (
            f"in={self.full_in_features} → cols {self.cols.start}:{self.cols.stop}, "
            f"out={self.out_features}, input_is_parallel={self.input_is_parallel}"
        )
