"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, §3): layers split across ranks.

Introduced in notebooks/12_tensor_parallel.ipynb.

``comm`` holds the conjugate operators ``f``/``g`` (how tensors move), ``layers`` the
column- and row-parallel linear layers built from an ``nn.Linear`` (what they compute),
``blocks`` the parallel MLP and attention, ``apply`` the plan-driven
``apply_tensor_parallel(model, plan, group)``.
"""

from __future__ import annotations

from labkit.parallel.tensor.apply import STYLES, apply_tensor_parallel, matching_slices
from labkit.parallel.tensor.blocks import (
    ATTENTION_PLAN,
    MLP_PLAN,
    all_reduces_per_step,
    block_plan,
    parallelize_attention,
    parallelize_mlp,
)
from labkit.parallel.tensor.comm import (
    copy_to_parallel,
    gather_from_parallel,
    reduce_from_parallel,
    split_to_parallel,
)
from labkit.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear, shard_range

__all__ = [
    "ATTENTION_PLAN",
    "MLP_PLAN",
    "STYLES",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "all_reduces_per_step",
    "apply_tensor_parallel",
    "block_plan",
    "copy_to_parallel",
    "gather_from_parallel",
    "matching_slices",
    "parallelize_attention",
    "parallelize_mlp",
    "reduce_from_parallel",
    "shard_range",
    "split_to_parallel",
]
