"""ZeRO stage 1, P_os: each rank keeps Adam's states only for its shard of the parameters.

Introduced in notebooks/13_zero_and_fsdp.ipynb.
"""

from __future__ import annotations

import torch
from torch import nn

from labkit.parallel.zero.comm import reduce_scatter_unit
from labkit.parallel.zero.replicated import ReplicatedParameters

__all__ = ["ZeroStage1"]


class ZeroStage1(ReplicatedParameters):
    """ZeRO-1 (P_os, Rajbhandari et al. 2020, §5.1): optimizer states partitioned.

    Every rank keeps the full parameters and full gradients, as in data parallelism, but
    Adam's momentum and variance only for its own shard (1/N_d of every parameter,
    ``shard_bounds``). Each parameter lives in a buffer padded to N_d·s elements; the
    module's parameter and this rank's shard are views of it, so the shard costs no memory
    (``ReplicatedParameters``, shared with stage 2). Gradients are views of a padded buffer
    per unit too, laid out the same way. ``step()`` follows the paper's
    schedule (§7.2.1): it reduce-scatters each unit's gradients, so that this rank receives
    the average over ranks of its own shard only (written into its part of the gradient
    buffer; the rest of the buffer keeps this rank's local, unreduced gradients, which nothing
    reads), runs Adam on the shard, and all-gathers the updated shards so every rank holds the
    new parameters: one reduce-scatter and one all-gather of Ψ per unit, 2Ψ per step as plain
    data parallelism's all-reduce. Per device: 2Ψ + 2Ψ + KΨ/N_d in the paper's
    mixed-precision units.

    Args:
        module: the model on this rank (same on every rank after the initial broadcast).
        group: the data-parallel group (None: the default group).
        lr, betas, eps, weight_decay: ``torch.optim.Adam``'s arguments.

    Usage::

        zero = ZeroStage1(model, lr=1e-2)
        F.cross_entropy(model(x), y).backward()
        zero.step()
        zero.zero_grad()
    """

    stage = 1

    def _shard(self) -> list[nn.Parameter]:
        self._reduced = False
        shards = self._shard_parameters()
        self.grad_buffers: list[torch.Tensor] = []
        for unit, pbuf, (a, b) in zip(
            self.units, self.param_buffers, self._shard_index(), strict=True
        ):
            gbuf = torch.zeros_like(pbuf)  # the same padded regions as the parameters'
            views = self._views(unit, gbuf)
            for p, shard, (full, mine) in zip(unit.params, shards[a:b], views, strict=True):
                p.grad, shard.grad = full, mine
            self.grad_buffers.append(gbuf)
        return shards

    def _grad_tensors(self) -> list[torch.Tensor | None]:
        return [*self.grad_buffers, *(p.grad for p in self.full_params)]

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Reduce-scatter each unit's gradients: this rank's shard gets their average.

        ZeRO §7.2.1: P_os needs only the reduced gradient of the shard a rank updates, so a
        reduce-scatter ((N_d − 1)/N_d · Ψ sent per rank on a ring) replaces data
        parallelism's all-reduce (twice that). ``step()`` calls it unless it ran already
        this step (a caller clipping the reduced gradients calls it first).
        """
        if self._reduced:
            return
        self._reduced = True
        nd = self.dp_world_size
        for unit, gbuf, (a, b) in zip(
            self.units, self.grad_buffers, self._shard_index(), strict=True
        ):
            grads = []
            for p, (view, _) in zip(unit.params, self._views(unit, gbuf), strict=True):
                if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                    # model.zero_grad() set .grad to None or a new tensor: point it back
                    view.copy_(p.grad if p.grad is not None else torch.zeros_like(view))
                    p.grad = view
                grads.append(view)
            piece = reduce_scatter_unit(unit, grads, nd, self.group)  # (S,), averaged
            self.observe(extra=[piece])
            mine = zip(self.shards[a:b], unit.shard_sizes, unit.offsets, strict=True)
            for shard, s, off in mine:
                shard.grad.copy_(piece[off : off + s])  # a view of this rank's part of gbuf

    def zero_grad(self) -> None:
        """Zero the gradient buffers (they stay allocated; ``.grad`` stays a view of them)."""
        for gbuf in self.grad_buffers:
            gbuf.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """Reduce-scatter the gradients, update this rank's shard with Adam, all-gather it."""
        self.reduce_gradients()
        self.optimizer.step()
        self.observe()
        self.all_gather_parameters()
        self._reduced = False
