"""PyTorch's FSDP2 (``fully_shard``) on the same units as labkit's ZeRO-3, and its bytes.

Introduced in notebooks/13_zero_and_fsdp.ipynb.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from labkit.memory import MemoryBreakdown
from labkit.parallel.zero.base import storage_bytes
from labkit.parallel.zero.layout import find_units

__all__ = ["apply_fully_shard", "fsdp_rank_bytes"]


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.to_local() if t is not None and hasattr(t, "to_local") else t


def apply_fully_shard(module: nn.Module, group: Any = None) -> nn.Module:
    """Shard ``module`` with FSDP2: one ``fully_shard`` group per unit, then the root.

    Each module with parameters of its own (``find_units``, the units of ``ZeroStage3``)
    becomes an FSDP2 group — all-gathered before its forward and backward, reduce-scattered
    after its backward — so the communication matches labkit's ZeRO-3. FSDP2 shards every
    parameter on dim 0 as a ``DTensor`` (``torch.distributed.fsdp.fully_shard``, PyTorch ≥
    2.6; the design of Zhao et al. 2023, "PyTorch FSDP", VLDB, §3). A parameter that is
    already a DTensor on a tp mesh (``parallelize_module``) becomes a 2-D DTensor, sharded
    over dp and tp (torchtitan's FSDP2 × TP): pass the dp axis of the same 2-D mesh.

    Args:
        module: the model on this rank (sharded in place).
        group: the data-parallel ``DeviceMesh`` (1-D, e.g. ``mesh["dp"]``), or its
            ``ProcessGroup`` (None: the default group).

    Returns:
        ``module`` (its class now also an ``FSDPModule``).
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    if isinstance(group, DeviceMesh):
        mesh = group
    else:
        group = group if group is not None else dist.group.WORLD
        mesh = DeviceMesh.from_group(group, next(module.parameters()).device.type)
    for unit in find_units(module, mesh.size()):
        if unit.module is not module:
            fully_shard(unit.module, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module


def fsdp_rank_bytes(module: nn.Module, optimizer: torch.optim.Optimizer) -> MemoryBreakdown:
    """Bytes one rank of an FSDP2 model holds at rest: local shards, their grads, Adam states.

    Args:
        module: a model sharded with ``fully_shard``.
        optimizer: the optimizer over its (DTensor) parameters.

    Returns:
        A ``labkit.memory.MemoryBreakdown`` (stage 3) of the local tensors' storages.
    """
    params = list(module.parameters())
    n = sum(p.numel() for p in params)  # a DTensor's numel is the global one
    seen: set[int] = set()
    pb = storage_bytes([_local(p) for p in params], seen)
    gb = storage_bytes([_local(p.grad) for p in params], seen)
    states = [_local(t) for st in optimizer.state.values() for t in st.values()]
    ob = storage_bytes([t for t in states if isinstance(t, torch.Tensor)], seen)
    mesh = getattr(params[0], "device_mesh", None)
    nd = mesh.size() if mesh is not None else 1
    return MemoryBreakdown(3, float(n), nd, float(pb), float(gb), float(ob))
