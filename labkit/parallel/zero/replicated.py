"""What ZeRO stages 1 and 2 share: full parameters on every rank, in padded per-unit buffers.

Introduced in notebooks/13_zero_and_fsdp.ipynb.
"""

from __future__ import annotations

import torch
from torch import nn

from labkit.parallel.zero.base import ZeroBase
from labkit.parallel.zero.comm import all_gather_unit
from labkit.parallel.zero.layout import Unit

__all__ = ["ReplicatedParameters"]


class ReplicatedParameters(ZeroBase):
    """The parameter side of ZeRO-1 and ZeRO-2 (Rajbhandari et al. 2020, §5.1 and §5.2).

    Every rank keeps the full parameters. Each unit's parameters live in one buffer in which
    every parameter has a region padded to N_d·s elements (s = its shard size,
    ``shard_bounds``); the module's parameter and this rank's shard (the ``nn.Parameter``
    Adam updates) are views of it, so the shard costs no memory. After Adam has updated the
    shards, ``all_gather_parameters`` gathers them so every rank holds the new parameters
    (one all-gather per unit). What the stages do with the gradients is their own.

    Args:
        as ``ZeroBase``.
    """

    def _views(self, unit: Unit, buf: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per parameter of ``unit``: its full view in ``buf`` and this rank's shard of it.

        Args:
            unit: the unit.
            buf: a padded buffer of ``N_d · unit.shard_numel`` elements.

        Returns:
            ``(full, mine)`` per parameter: ``full`` its first ``numel`` elements of the
            parameter's N_d·s region, in its shape; ``mine`` the region's s elements of
            this rank.
        """
        nd, r, out = self.dp_world_size, self.dp_rank, []
        for p, s, off in zip(unit.params, unit.shard_sizes, unit.offsets, strict=True):
            base = nd * off  # the parameter's padded region: nd·s elements from here
            full = buf[base : base + p.numel()].view(p.shape)
            out.append((full, buf[base + r * s : base + (r + 1) * s]))
        return out

    def _shard_parameters(self) -> list[nn.Parameter]:
        """Move every unit's parameters into its padded buffer; return this rank's shards."""
        self.param_buffers: list[torch.Tensor] = []
        shards = []
        for unit in self.units:
            pbuf = unit.params[0].new_zeros(self.dp_world_size * unit.shard_numel)
            for p, (full, mine) in zip(unit.params, self._views(unit, pbuf), strict=True):
                full.copy_(p.detach())
                p.data = full
                shards.append(nn.Parameter(mine))
            self.param_buffers.append(pbuf)
        return shards

    def _param_tensors(self) -> list[torch.Tensor | None]:
        return [*self.param_buffers, *self.shards]

    def _shard_index(self) -> list[tuple[int, int]]:
        """For each unit, the slice of ``self.shards`` holding its parameters' pieces."""
        out, i = [], 0
        for unit in self.units:
            out.append((i, i + len(unit.params)))
            i += len(unit.params)
        return out

    def all_gather_parameters(self) -> None:
        """All-gather each unit's shards into the full parameters (after Adam; after a load)."""
        with torch.no_grad():
            for unit, (a, b) in zip(self.units, self._shard_index(), strict=True):
                packed = torch.cat([s.detach() for s in self.shards[a:b]])  # (S,)
                full = all_gather_unit(unit, packed, self.dp_world_size, self.group)
                self.observe(extra=[packed, *full])
                for p, f in zip(unit.params, full, strict=True):
                    p.copy_(f)
