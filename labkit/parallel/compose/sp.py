"""``apply_sp``: tensor parallelism with sequence parallelism, on the tp axis, in one call.

Introduced in notebooks/15_sequence_parallel.ipynb (the composition layer is notebook 18's).

Sequence parallelism (Korthikanti et al. 2022, §4.2.2) is not a new mesh axis: it runs on the
tensor-parallel ranks, sharding along the sequence what tensor parallelism leaves replicated
(the LayerNorms, the residual stream). torchtitan turns it on inside ``apply_tp``
(``enable_sp``); here it is its own verb so that the plan is the block's, not the caller's:

- ``"megatron"``: ``labkit.parallel.sequence.apply_sequence_parallel`` swaps each block's
  attention and MLP for their sequence-parallel versions (labkit's column/row shards, the
  GEMM inputs re-gathered in backward), and ``add_sequence_region`` scatters the first block's
  input and gathers the last block's output;
- ``"dtensor"``: ``parallelize_module`` with ``SequenceParallel`` on the LayerNorms and
  ``Shard(1)`` layouts around the column/row-parallel layers.

Either way the LayerNorms' (and the row biases') gradients are partial sums over tp until
:func:`reduce_sp_gradients` runs (``Parallelized.reduce_gradients`` calls it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from labkit.parallel.compose.tp import TP_STYLES, as_group
from labkit.parallel.sequence import (
    add_sequence_region,
    apply_sequence_parallel,
    find_blocks,
    parallelize_sequence_dtensor,
    reduce_sequence_parallel_grads,
    replicate_partial_grads,
)

__all__ = ["apply_sp", "reduce_sp_gradients"]


def apply_sp(
    module: nn.Module,
    tp: Any,
    style: str = "megatron",
    blocks: Iterable[str] | None = None,
    regather: bool = True,
) -> nn.Module:
    """Make ``module``'s transformer blocks tensor- and sequence-parallel over ``tp``, in place.

    The blocks must be consecutive (each one's output the next one's input): the region is
    entered before the first and left after the last, so the model takes and returns whole
    sequences (B, T, h) whatever runs before and after the blocks.

    Args:
        module: the model, the same on every rank of ``tp``.
        tp: the tensor-parallel ``DeviceMesh`` (1-D) or, for ``"megatron"``, its group.
        style: ``"megatron"`` (labkit's layers) or ``"dtensor"`` (``parallelize_module``).
        blocks: the blocks' names in order (None: every submodule with ``ln1``, ``attn``,
            ``ln2`` and ``mlp``).
        regather: ``"megatron"`` only: keep the GEMM inputs sharded and gather them again in
            backward (Korthikanti §4.2.2); DTensor keeps them gathered.

    Returns:
        ``module``.

    Raises:
        ValueError: an unknown style, no blocks, ``"dtensor"`` without a DeviceMesh, or heads
            and widths the tp degree does not divide.
        KeyError: a block name that is not a submodule.
    """
    if style not in TP_STYLES:
        raise ValueError(f"style must be one of {TP_STYLES}, got {style!r}")
    found = find_blocks(module, blocks)
    if not found:
        raise ValueError("apply_sp found no transformer block (ln1, attn, ln2, mlp)")
    names = [n for n, _ in found]
    if style == "megatron":
        group = as_group(tp)
        apply_sequence_parallel(module, group, names, regather)
        add_sequence_region(found[0][1], found[-1][1], group)
        return module
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(tp, DeviceMesh):
        raise ValueError("style 'dtensor' needs the tp DeviceMesh (e.g. mesh['tp']), not a group")
    return parallelize_sequence_dtensor(module, tp, names, region=True)


def reduce_sp_gradients(module: nn.Module, tp: Any, style: str = "megatron") -> None:
    """Sum the LayerNorms' and row biases' partial gradients over tp (after the last backward).

    Args:
        module: the model after :func:`apply_sp`.
        tp: the tensor-parallel ``DeviceMesh`` or group.
        style: as given to :func:`apply_sp`.

    Returns:
        None: ``"megatron"``: one coalesced all-reduce (Megatron-LM's
        ``_allreduce_layernorm_grads``); ``"dtensor"``: each ``Partial`` gradient
        redistributed to ``Replicate`` (one all-reduce each).
    """
    if style == "megatron":
        reduce_sequence_parallel_grads(module, as_group(tp))
    else:
        replicate_partial_grads(module)
