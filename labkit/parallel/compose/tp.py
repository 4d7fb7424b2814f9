"""``apply_tp``: tensor parallelism from one plan, by labkit's Megatron layers or by DTensor.

Introduced in notebooks/18_hybrid_parallel.ipynb (the two implementations are notebook 12's).

The plan maps submodule names to ``"colwise"`` / ``"rowwise"`` (torchtitan's ``apply_tp``
spells the same plan with ``ColwiseParallel()`` / ``RowwiseParallel()``). Two styles:

- ``"megatron"``: ``labkit.parallel.tensor.apply_tensor_parallel`` swaps each ``nn.Linear``
  for a ``ColumnParallelLinear`` / ``RowParallelLinear`` holding plain tensors (Shoeybi et al.
  2019, §3); it composes with labkit's DDP and the pipeline runtime;
- ``"dtensor"``: ``torch.distributed.tensor.parallel.parallelize_module`` turns the weights
  into DTensors on the tp mesh. FSDP2 composes only with this style: ``fully_shard`` shards a
  tp DTensor again over dp, giving a 2-D DTensor (torchtitan's FSDP2 × TP).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from labkit.parallel.tensor import ColumnParallelLinear, RowParallelLinear, apply_tensor_parallel

__all__ = ["TP_STYLES", "apply_tp", "as_group", "gather_tp", "tp_split"]

TP_STYLES = ("megatron", "dtensor")


def as_group(tp: Any) -> dist.ProcessGroup:
    """The process group of a 1-D ``DeviceMesh``, or the group itself.

    Args:
        tp: a 1-D ``DeviceMesh`` (e.g. ``mesh["tp"]``) or a ``ProcessGroup``.

    Returns:
        The ``ProcessGroup``.
    """
    return tp if isinstance(tp, dist.ProcessGroup) else tp.get_group()


def apply_tp(
    module: nn.Module, plan: dict[str, str], tp: Any, style: str = "megatron"
) -> nn.Module:
    """Split the linear layers named in ``plan`` over the tensor-parallel ranks, in place.

    Args:
        module: the unsplit model (or pipeline stage), the same on every rank of ``tp``.
        plan: submodule name → ``"colwise"`` or ``"rowwise"`` (Megatron's MLP: ``fc1``
            colwise, ``fc2`` rowwise; attention: ``q``, ``k``, ``v`` colwise, ``proj`` rowwise).
        tp: the tensor-parallel ``DeviceMesh`` (1-D, e.g. ``mesh["tp"]``) or, for
            ``"megatron"``, its ``ProcessGroup``.
        style: ``"megatron"`` (labkit's layers) or ``"dtensor"`` (``parallelize_module``).

    Returns:
        ``module``, with the named layers split.

    Raises:
        ValueError: an unknown style or plan entry, or ``"dtensor"`` without a DeviceMesh.
        KeyError, TypeError: as ``apply_tensor_parallel`` (a name that is not an ``nn.Linear``).
    """
    if style not in TP_STYLES:
        raise ValueError(f"style must be one of {TP_STYLES}, got {style!r}")
    bad = {k: v for k, v in plan.items() if v not in ("colwise", "rowwise")}
    if bad:
        raise ValueError(f"plan styles must be 'colwise' or 'rowwise', got {bad}")
    if style == "megatron":
        return apply_tensor_parallel(module, plan, as_group(tp))
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if not isinstance(tp, DeviceMesh):
        raise ValueError("style 'dtensor' needs the tp DeviceMesh (e.g. mesh['tp']), not a group")
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    return parallelize_module(module, tp, {k: styles[v]() for k, v in plan.items()})


def tp_split(module: nn.Module) -> dict[int, int]:
    """Which of ``module``'s plain parameters labkit's Megatron layers split, and along which dim.

    A ``ColumnParallelLinear`` holds rows of the weight and of the bias (dim 0); a
    ``RowParallelLinear`` columns of the weight (dim 1), its bias whole (added once, after the
    all-reduce). Every other parameter is whole on every tp rank. (DTensor parameters carry
    their layout themselves: ``placements``.)

    Args:
        module: a model after ``apply_tp(..., style="megatron")``.

    Returns:
        ``{id(parameter): dim}`` for the split parameters.
    """
    out: dict[int, int] = {}
    for mod in module.modules():
        if isinstance(mod, ColumnParallelLinear):
            out[id(mod.weight)] = 0
            if mod.bias is not None:
                out[id(mod.bias)] = 0
        elif isinstance(mod, RowParallelLinear):
            out[id(mod.weight)] = 1
    return out


def gather_tp(t: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """The whole tensor from every tp rank's slice along ``dim`` (one all-gather; collective).

    Args:
        t: this rank's slice.
        dim: the dimension it was split along.
        group: the tensor-parallel group.

    Returns:
        The concatenation of the ranks' slices, in rank order.
    """
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.detach().contiguous(), group=group)
    return torch.cat(parts, dim)
