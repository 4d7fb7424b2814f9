"""ZeRO stage 2, P_os+g: gradients reduce-scattered as backward produces them, then freed.

Introduced in notebooks/13_zero_and_fsdp.ipynb.
"""

from __future__ import annotations

import torch
from torch import nn

from labkit.parallel.zero.comm import reduce_scatter_unit
from labkit.parallel.zero.layout import Unit
from labkit.parallel.zero.stage1 import ZeroStage1

__all__ = ["ZeroStage2"]


class ZeroStage2(ZeroStage1):
    """ZeRO-2 (P_os+g, Rajbhandari et al. 2020, §5.2): optimizer states and gradients sharded.

    Parameters stay full on every rank, as in stage 1. Each parameter gets a
    post-accumulate-grad hook; when every parameter of a unit (a layer) has its gradient,
    the unit's gradients are reduce-scattered (``dist.reduce_scatter_tensor``, one per
    unit), the averaged piece is added to this rank's gradient shard, and the full gradients
    are dropped (``.grad = None``) — so at most one layer's full gradients are alive, and at
    rest a rank holds only its 1/N_d of the gradients. ``step()`` runs Adam on the shard and
    all-gathers the parameters (one per unit). Per device: 2Ψ + (2 + K)Ψ/N_d.

    Introduced in notebooks/13_zero_and_fsdp.ipynb.

    Args:
        module: the model on this rank.
        group: the data-parallel group (None: the default group).
        lr, betas, eps, weight_decay: ``torch.optim.Adam``'s arguments.
    """

    stage = 2

    def _shard(self) -> list[nn.Parameter]:
        shards = super()._shard()  # parameters as in stage 1, no full gradient buffers
        self.grad_shards: list[torch.Tensor] = []
        self._arrived: list[int] = []
        i = 0
        for k, unit in enumerate(self.units):
            gshard = unit.params[0].new_zeros(unit.shard_numel)
            for p, s, off in zip(unit.params, unit.shard_sizes, unit.offsets, strict=True):
                shards[i].grad = gshard[off : off + s]
                p.register_post_accumulate_grad_hook(self._hook(k))
                i += 1
            self.grad_shards.append(gshard)
            self._arrived.append(0)
        return shards

    def _hook(self, k: int):
        def hook(p: torch.Tensor) -> None:
            self._arrived[k] += 1
            if self._arrived[k] == len(self.units[k].params):
                self._arrived[k] = 0
                self._reduce_unit(self.units[k], self.grad_shards[k])

        return hook

    def _reduce_unit(self, unit: Unit, gshard: torch.Tensor) -> None:
        """Reduce-scatter the unit's full gradients into ``gshard``, then free them."""
        with torch.no_grad():
            self.observe()  # the layer's full gradients are alive now
            gshard.add_(
                reduce_scatter_unit(
                    unit, [p.grad for p in unit.params], self.dp_world_size, self.group
                )
            )
        for p in unit.params:
            p.grad = None

    def _grad_tensors(self) -> list[torch.Tensor | None]:
        return [*self.grad_shards, *(p.grad for p in self.full_params)]

    def zero_grad(self) -> None:
        """Zero this rank's gradient shards."""
        for gshard in self.grad_shards:
            gshard.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's shard with Adam (gradients already reduced), all-gather it."""
        self._check_all_reduced()
        self.optimizer.step()
        self.observe()
        self._all_gather_parameters()
