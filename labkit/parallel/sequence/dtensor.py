"""Sequence parallelism with DTensor: ``SequenceParallel`` and the ``*Parallel`` layouts.

Introduced in notebooks/15_sequence_parallel.ipynb.

The same block as ``labkit.parallel.sequence.apply``, spelled as a
``torch.distributed.tensor.parallel.parallelize_module`` plan, the way torchtitan's
``apply_tp`` writes it (``torchtitan/models/llama3/infra/parallelize.py``, with sequence
parallelism on):

- ``SequenceParallel()`` on ``ln1`` and ``ln2``: the LayerNorm's parameters are replicated
  DTensors, its input and output ``Shard(1)`` (this rank's tokens);
- ``PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())`` on the
  attention: one all-gather (``g``) that q, k and v all read, then ``ColwiseParallel()`` each;
- ``RowwiseParallel(output_layouts=Shard(1))`` on ``proj`` and ``fc2``: the partial sums are
  reduce-scattered (``ḡ``) instead of all-reduced;
- ``ColwiseParallel(input_layouts=Shard(1))`` on ``fc1``: the all-gather inside the layer.

DTensor keeps the gathered GEMM inputs for backward (no re-gather), and leaves the
LayerNorms' gradients ``Partial(sum)``: they are reduced when something asks for them as
``Replicate`` (an optimizer step on the replicated parameter, ``full_tensor()``), or by
:func:`replicate_partial_grads`, one all-reduce per such gradient.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

__all__ = [
    "dtensor_sequence_plan",
    "parallelize_sequence_dtensor",
    "region_style",
    "replicate_partial_grads",
]


def dtensor_sequence_plan(prefix: str = "") -> dict:
    """The ``parallelize_module`` plan of one sequence-parallel ``TransformerBlock``.

    Args:
        prefix: the block's name in the model (``""``: the block is the module).

    Returns:
        dict: submodule name → ``ParallelStyle``; the block takes and returns ``Shard(1)``.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    def name(n: str) -> str:
        return f"{prefix}.{n}" if prefix else n

    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {
        name("ln1"): SequenceParallel(),
        name("attn"): gather,
        **{name(f"attn.{n}"): ColwiseParallel() for n in "qkv"},
        name("attn.proj"): RowwiseParallel(output_layouts=Shard(1)),
        name("ln2"): SequenceParallel(),
        name("mlp.fc1"): ColwiseParallel(input_layouts=Shard(1)),
        name("mlp.fc2"): RowwiseParallel(output_layouts=Shard(1)),
    }


def region_style(enter: bool, leave: bool) -> Any:
    """The style that scatters a block's whole-sequence input and/or gathers its output.

    Args:
        enter: Replicate → Shard(1) on the input (``PrepareModuleInput``): the first block.
        leave: Shard(1) → Replicate on the output (``PrepareModuleOutput``): the last block.

    Returns:
        The ``ParallelStyle`` (local tensors in and out), or None when neither.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleInputOutput,
        PrepareModuleOutput,
    )

    into = {"input_layouts": (Replicate(),), "desired_input_layouts": (Shard(1),)}
    out_of = {"output_layouts": (Shard(1),), "desired_output_layouts": (Replicate(),)}
    if enter and leave:
        return PrepareModuleInputOutput(**into, use_local_input=True, **out_of)
    if enter:
        return PrepareModuleInput(**into, use_local_output=True)
    return PrepareModuleOutput(**out_of) if leave else None


def parallelize_sequence_dtensor(
    module: nn.Module, mesh: Any, blocks: Iterable[str], region: bool = True
) -> nn.Module:
    """Apply :func:`dtensor_sequence_plan` to consecutive blocks with ``parallelize_module``.

    Args:
        module: the model (or one block, named ``""``), the same on every rank of ``mesh``.
        mesh: the 1-D tensor-parallel ``DeviceMesh``.
        blocks: the blocks' names in order (``[""]``: ``module`` is the block).
        region: the first block scatters the model's whole-sequence input and the last gathers
            its output (:func:`region_style`); False: the blocks take and return this rank's
            tokens.

    Returns:
        nn.Module: ``module``, its parameters DTensors on ``mesh``.

    Raises:
        ValueError: no blocks.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    names = list(blocks)
    if not names:
        raise ValueError("no blocks to parallelize")
    plan: dict[str, Any] = {}
    for n in names:
        plan |= dtensor_sequence_plan(n)
    parallelize_module(module, mesh, plan)
    if region:
        ends = {names[0]: [True, False]}
        ends.setdefault(names[-1], [False, False])[1] = True
        modules = dict(module.named_modules())
        for n, (enter, leave) in ends.items():
            parallelize_module(modules[n], mesh, region_style(enter, leave))
    return module


def replicate_partial_grads(module: nn.Module) -> int:
    """Redistribute every ``Partial`` DTensor gradient to ``Replicate`` (an all-reduce each).

    Args:
        module: a model after :func:`parallelize_sequence_dtensor`, after backward.

    Returns:
        int: the number of gradients all-reduced.
    """
    from torch.distributed.tensor import Replicate

    n = 0
    for p in module.parameters():
        g = p.grad
        if g is not None and any(pl.is_partial() for pl in getattr(g, "placements", ())):
            p.grad = g.redistribute(placements=[Replicate()] * len(g.placements))
            n += 1
    return n
