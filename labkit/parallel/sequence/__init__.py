"""Sequence parallelism (Korthikanti et al. 2022): LayerNorm regions sharded along the sequence.

Introduced in notebooks/15_sequence_parallel.ipynb.

``comm`` holds the operators (``g``: all-gather forward, reduce-scatter backward; ``ḡ``: the
reverse; the region's entry and exit), ``layers`` the sequence-parallel attention and MLP
(with Megatron-LM's re-gather of the GEMM inputs in backward), ``apply`` the in-place
``apply_sequence_parallel(model, group)`` and the all-reduce of the LayerNorms' partial
gradients, ``dtensor`` the same block with DTensor's ``SequenceParallel`` and layouts. The
collective counts are ``labkit.costmodel.sequence_parallel_collectives``; the activation bytes
``labkit.memory.block_activation_terms``.
"""

from __future__ import annotations

from labkit.parallel.sequence.apply import (
    add_sequence_region,
    apply_sequence_parallel,
    find_blocks,
    reduce_sequence_parallel_grads,
    sequence_parallel_params,
    sum_coalesced,
)
from labkit.parallel.sequence.comm import (
    SEQ_DIM,
    all_gather_sequence,
    gather_from_sequence,
    reduce_scatter_sequence,
    reduce_scatter_to_sequence,
    scatter_to_sequence,
    split_sequence,
)
from labkit.parallel.sequence.dtensor import (
    dtensor_sequence_plan,
    parallelize_sequence_dtensor,
    region_style,
    replicate_partial_grads,
)
from labkit.parallel.sequence.layers import (
    SequenceParallelAttention,
    SequenceParallelMLP,
    gather_linears,
)

__all__ = [
    "SEQ_DIM",
    "SequenceParallelAttention",
    "SequenceParallelMLP",
    "add_sequence_region",
    "all_gather_sequence",
    "apply_sequence_parallel",
    "dtensor_sequence_plan",
    "find_blocks",
    "gather_from_sequence",
    "gather_linears",
    "parallelize_sequence_dtensor",
    "reduce_scatter_sequence",
    "reduce_scatter_to_sequence",
    "reduce_sequence_parallel_grads",
    "region_style",
    "replicate_partial_grads",
    "scatter_to_sequence",
    "sequence_parallel_params",
    "split_sequence",
    "sum_coalesced",
]
