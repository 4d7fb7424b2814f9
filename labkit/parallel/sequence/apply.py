"""``apply_sequence_parallel``: make transformer blocks tensor- *and* sequence-parallel, in place.

Introduced in notebooks/15_sequence_parallel.ipynb.

Korthikanti et al. 2022, §4.2.2. In each block the attention and the MLP become
``SequenceParallelAttention`` / ``SequenceParallelMLP`` (heads and inner columns split as in
tensor parallelism); the LayerNorms and the residual additions are left as they are — they act
on each token alone, so on this rank's tokens they compute exactly this rank's part. Parameter
names do not change.

Three things follow from running on a slice of the sequence:

- the blocks take and return (B, T/p, h): :func:`add_sequence_region` scatters the first
  block's input and gathers the last one's output, so the rest of the model sees whole
  sequences;
- the parameters that touch only this rank's tokens — the LayerNorms' and the row-parallel
  biases — get partial gradients (the sum over this rank's tokens): Megatron-LM all-reduces
  them over the tensor-parallel group after backward (``finalize_model_grads``, which
  coalesces them); :func:`reduce_sequence_parallel_grads` is that one all-reduce;
- dropout in these regions (none in ``labkit.models``) would need a different random stream
  per rank, since each rank now draws masks for different tokens (Megatron forks its RNG).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from labkit.parallel.sequence.comm import gather_from_sequence, scatter_to_sequence
from labkit.parallel.sequence.layers import SequenceParallelAttention, SequenceParallelMLP

__all__ = [
    "MARK",
    "add_sequence_region",
    "apply_sequence_parallel",
    "find_blocks",
    "reduce_sequence_parallel_grads",
    "sequence_parallel_params",
    "sum_coalesced",
]

MARK = "sequence_parallel"  # the attribute Megatron-LM sets on such parameters


def find_blocks(
    module: nn.Module, names: Iterable[str] | None = None
) -> list[tuple[str, nn.Module]]:
    """The transformer blocks of ``module``, by name, in ``named_modules`` order.

    Args:
        module: a block or a model holding blocks.
        names: the blocks' names (``""``: ``module`` itself); None: every submodule with
            ``ln1``, ``attn``, ``ln2`` and ``mlp``.

    Returns:
        list[tuple[str, nn.Module]]: (name, block) pairs.

    Raises:
        KeyError: a name that is not a submodule.
    """
    modules = dict(module.named_modules())
    if names is None:  # every block-shaped submodule (labkit.models.TransformerBlock's parts)
        return [
            (n, m)
            for n, m in modules.items()
            if all(hasattr(m, a) for a in ("ln1", "attn", "ln2", "mlp"))
        ]
    out = []
    for name in names:
        if name not in modules:
            raise KeyError(f"{name!r} is not a submodule; submodules: {sorted(modules)[1:]}")
        out.append((name, modules[name]))
    return out


def apply_sequence_parallel(
    module: nn.Module,
    group: dist.ProcessGroup | None = None,
    blocks: Iterable[str] | None = None,
    regather: bool = True,
) -> nn.Module:
    """Make each named transformer block sequence-parallel over ``group``, in place.

    Korthikanti et al. 2022, §4.2.2, Figure 5: per block, in forward, two all-gathers (into
    the attention and the MLP) and two reduce-scatters (out of them) of B·T·h elements replace
    tensor parallelism's two all-reduces; backward mirrors them (plus two all-gathers when
    ``regather``).

    Args:
        module: a block (``ln1``, ``attn``, ``ln2``, ``mlp``) or a model holding blocks, the
            same on every rank of ``group``.
        group: the tensor-parallel group (None: the default group).
        blocks: names of the blocks (``""``: ``module`` itself); None: every submodule that
            has ``ln1``, ``attn``, ``ln2`` and ``mlp``.
        regather: keep each gathered GEMM input as this rank's slice, gathering it again in
            backward (Megatron-LM, Korthikanti §4.2.2) — or keep it whole (False).

    Returns:
        nn.Module: ``module``; the blocks now take and return this rank's tokens (B, T/p, h).

    Raises:
        KeyError: a name that is not a submodule.
        ValueError: no block found, a block already sequence-parallel, or heads / widths not
            divisible by the group size.
    """
    found = find_blocks(module, blocks)
    if not found:
        raise ValueError("no transformer block (ln1, attn, ln2, mlp) found to parallelize")
    for name, block in found:
        if isinstance(block.attn, SequenceParallelAttention):
            raise ValueError(f"block {name!r} is already sequence-parallel")
        block.attn = SequenceParallelAttention(block.attn, group, regather)
        block.mlp = SequenceParallelMLP(block.mlp, group, regather)
        for p in (*block.ln1.parameters(), *block.ln2.parameters()):
            setattr(p, MARK, True)
        for row in (block.attn.proj, block.mlp.fc2):
            if row.bias is not None:
                setattr(row.bias, MARK, True)
    return module


def add_sequence_region(
    first: nn.Module, last: nn.Module | None = None, group: dist.ProcessGroup | None = None
) -> None:
    """Scatter ``first``'s input along the sequence and gather ``last``'s output (hooks).

    Megatron-LM enters the region after the embedding (``scatter_to_sequence_parallel_region``)
    and leaves it before the output layer (``gather_from_sequence_parallel_region`` with a
    whole gradient on every rank: ``grad="split"``), so the rest of the model sees whole
    sequences.

    Args:
        first: the first sequence-parallel block; its first positional input is (B, T, h),
            replicated on every rank.
        last: the last one (None: ``first``).
        group: the tensor-parallel group (None: the default group).

    Returns:
        None; the hooks stay on the modules.
    """

    def enter(_: nn.Module, args: tuple) -> tuple:
        return (scatter_to_sequence(args[0], group), *args[1:])

    def leave(_: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        return gather_from_sequence(out, group, grad="split")

    first.register_forward_pre_hook(enter)
    (first if last is None else last).register_forward_hook(leave)


def sequence_parallel_params(module: nn.Module) -> list[nn.Parameter]:
    """The parameters whose gradient is a partial sum over the tensor-parallel ranks.

    Args:
        module: a model after :func:`apply_sequence_parallel`.

    Returns:
        list[nn.Parameter]: the LayerNorms' weights and biases and the row-parallel biases of
        the sequence-parallel blocks, in ``parameters()`` order.
    """
    return [p for p in module.parameters() if getattr(p, MARK, False)]


def reduce_sequence_parallel_grads(
    module: nn.Module, group: dist.ProcessGroup | None = None
) -> int:
    """Sum the partial gradients of :func:`sequence_parallel_params` over ``group``: one all-reduce.

    Megatron-LM's ``_allreduce_layernorm_grads`` (in ``finalize_model_grads``): the gradients
    are flattened into one buffer, all-reduced, and copied back. Call it once per optimizer
    step, after the last backward (the sum is linear, so accumulation may come first).

    Args:
        module: a model after :func:`apply_sequence_parallel`, after backward.
        group: the tensor-parallel group (None: the default group).

    Returns:
        int: the number of elements all-reduced (0: nothing to do, no collective).
    """
    grads = [p.grad for p in sequence_parallel_params(module) if p.grad is not None]
    if not grads or dist.get_world_size(group) == 1:
        return 0
    return sum_coalesced(grads, group)


def sum_coalesced(tensors: list[torch.Tensor], group: dist.ProcessGroup | None = None) -> int:
    """Sum each tensor over ``group`` in place, with one all-reduce of them flattened together.

    Args:
        tensors: the partial sums (e.g. gradients), any shapes, one dtype and device.
        group: the group to sum over (None: the default group).

    Returns:
        int: the number of elements all-reduced.
    """
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
    return flat.numel()
