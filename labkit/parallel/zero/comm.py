"""The two collectives of ZeRO, one call per unit: all-gather parameters, reduce-scatter grads.

Introduced in notebooks/13_zero_and_fsdp.ipynb.

A unit's shard on every rank is the concatenation of its parameters' pieces (S elements), so
one ``all_gather_into_tensor`` of S elements per rank returns every parameter of the unit,
and one ``reduce_scatter_tensor`` of N_d·S elements leaves each rank the sum of its piece of
every gradient (ZeRO, Rajbhandari et al. 2020, §5.2 and §5.3; FSDP2's copy-in/copy-out).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from labkit.parallel.zero.layout import Unit

__all__ = ["all_gather_unit", "reduce_scatter_unit"]


def all_gather_unit(
    unit: Unit, shard: torch.Tensor, world_size: int, group: dist.ProcessGroup | None = None
) -> list[torch.Tensor]:
    """Every parameter of ``unit`` in full, from each rank's packed shard (one all-gather).

    Args:
        unit: the unit.
        shard: this rank's packed shard, 1-D of ``unit.shard_numel`` elements.
        world_size: N_d, the size of ``group``.
        group: the data-parallel group (None: the default group).

    Returns:
        One tensor per parameter of the unit, shaped like it (new memory).
    """
    out = shard.new_empty(world_size * unit.shard_numel)
    dist.all_gather_into_tensor(out, shard.contiguous(), group=group)
    return unit.unpack(out.view(world_size, unit.shard_numel))


def reduce_scatter_unit(
    unit: Unit,
    grads: list[torch.Tensor],
    world_size: int,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """This rank's piece of the average over ranks of ``unit``'s gradients (one reduce-scatter).

    Args:
        unit: the unit.
        grads: this rank's full gradient of each of the unit's parameters.
        world_size: N_d, the size of ``group``.
        group: the data-parallel group (None: the default group).

    Returns:
        A 1-D tensor of ``unit.shard_numel`` elements: the summed pieces divided by N_d.
    """
    packed = unit.pack([g.reshape(-1) for g in grads], world_size)  # (N_d, S)
    out = packed.new_empty(unit.shard_numel)
    dist.reduce_scatter_tensor(out, packed.view(-1), group=group)
    return out.div_(world_size)
