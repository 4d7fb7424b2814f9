"""ZeRO stage 2, P_os+g: gradients reduce-scattered as backward produces them, then freed.

Introduced in notebooks/13_zero_and_fsdp.ipynb.
"""

from __future__ import annotations

import torch
from torch import nn

from labkit.parallel.zero.base import GradientShards
from labkit.parallel.zero.replicated import ReplicatedParameters

__all__ = ["ZeroStage2"]


class ZeroStage2(ReplicatedParameters):
    """ZeRO-2 (P_os+g, Rajbhandari et al. 2020, §5.2): optimizer states and gradients sharded.

    Parameters stay full on every rank, as in stage 1 (``ReplicatedParameters``). Each
    parameter gets a post-accumulate-grad hook; when every parameter of a unit (a layer) has
    its gradient, the unit's gradients are reduce-scattered (``dist.reduce_scatter_tensor``,
    one per unit), the averaged piece is added to this rank's gradient shard, and the full
    gradients are dropped (``.grad = None``; ``GradientShards``, shared with stage 3) — so at
    most one layer's full gradients are alive, and at rest a rank holds only its 1/N_d of the
    gradients. ``step()`` runs Adam on the shard and all-gathers the parameters (one per
    unit). Per device: 2Ψ + (2 + K)Ψ/N_d.

    Args:
        module: the model on this rank.
        group: the data-parallel group (None: the default group).
        lr, betas, eps, weight_decay: ``torch.optim.Adam``'s arguments.
    """

    stage = 2

    def _shard(self) -> list[nn.Parameter]:
        shards = self._shard_parameters()  # no full gradient buffers: gradients are sharded
        self.gradients = GradientShards(self)
        self.grad_shards = self.gradients.shards
        for k, (unit, gshard, (a, b)) in enumerate(
            zip(self.units, self.grad_shards, self._shard_index(), strict=True)
        ):
            for p, shard, s, off in zip(
                unit.params, shards[a:b], unit.shard_sizes, unit.offsets, strict=True
            ):
                shard.grad = gshard[off : off + s]
                p.register_post_accumulate_grad_hook(self._hook(k))
        return shards

    def _hook(self, k: int):
        def hook(p: torch.Tensor) -> None:
            if self.gradients.arrive(k) and self.sync:  # under no_sync(): keep accumulating
                self.gradients.reduce(k)

        return hook

    def _grad_tensors(self) -> list[torch.Tensor | None]:
        return [*self.grad_shards, *(p.grad for p in self.full_params)]

    def zero_grad(self) -> None:
        """Zero this rank's gradient shards."""
        self.gradients.zero_()

    def reduce_gradients(self) -> None:
        """Nothing left to do: backward reduce-scattered every unit (checked)."""
        self.gradients.check_all_reduced()

    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's shard with Adam (gradients already reduced), all-gather it."""
        self.gradients.check_all_reduced()
        self.optimizer.step()
        self.observe()
        self.all_gather_parameters()
