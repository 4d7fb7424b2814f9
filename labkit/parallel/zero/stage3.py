"""ZeRO stage 3, P_os+g+p: parameters sharded at rest, gathered per layer just before use.

Introduced in notebooks/13_zero_and_fsdp.ipynb.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from labkit.parallel.zero.base import GradientShards, ZeroBase
from labkit.parallel.zero.comm import all_gather_unit
from labkit.parallel.zero.layout import Unit, shard_bounds

__all__ = ["ZeroStage3"]


def _free(p: torch.Tensor) -> None:
    p.untyped_storage().resize_(0)  # the tensor keeps its shape; autograd's saved views too


def _alloc(p: torch.Tensor) -> None:
    p.untyped_storage().resize_(p.numel() * p.element_size())


class ZeroStage3(ZeroBase):
    """ZeRO-3 (P_os+g+p, Rajbhandari et al. 2020, §5.3): parameters sharded too.

    At rest each rank holds only its shard of every parameter, its gradient shard and
    Adam's states for it: (2 + 2 + K)Ψ/N_d per device. The module's registered parameters
    *are* the shards (1-D, ``s`` elements each; ``model.parameters()`` lists them). Each
    unit (a module with parameters of its own) gets hooks:

    - forward pre-hook: all-gather the unit's shards into its full parameters and register
      those on the module for its forward;
    - forward hook: register the shards again and free the full parameters' storage
      (``untyped_storage().resize_(0)``, as FSDP does: autograd's saved views of them stay
      valid and are refilled later); a hook on the unit's output runs before the unit's
      backward and all-gathers again;
    - post-accumulate-grad hooks: when the unit's last gradient has arrived, reduce-scatter
      its gradients into this rank's gradient shard (``GradientShards``, shared with stage 2)
      and free both full gradients and full parameters.

    So a step all-gathers every unit twice (forward and backward) and reduce-scatters it once;
    ``step()`` is Adam on the shards alone, with no communication.

    Args:
        module: the model on this rank.
        group: the data-parallel group (None: the default group).
        lr, betas, eps, weight_decay: ``torch.optim.Adam``'s arguments.
    """

    stage = 3

    def _shard(self) -> list[nn.Parameter]:
        nd, r = self.dp_world_size, self.dp_rank
        self.gradients = GradientShards(self)
        self.param_shards, self.grad_shards, shards = [], self.gradients.shards, []
        self._gathered = [False] * len(self.units)
        for k, (unit, gshard) in enumerate(zip(self.units, self.grad_shards, strict=True)):
            pshard = unit.params[0].new_zeros(unit.shard_numel)  # (S,): my piece of each
            for name, p, s, off in zip(
                unit.names, unit.params, unit.shard_sizes, unit.offsets, strict=True
            ):
                lo, hi = shard_bounds(p.numel(), nd, r)
                mine = p.detach().reshape(-1)[lo:hi]  # shorter than s at the end: padding
                pshard[off : off + mine.numel()] = mine
                shard = nn.Parameter(pshard[off : off + s])
                shard.grad = gshard[off : off + s]
                unit.module.register_parameter(name, shard)
                p.register_post_accumulate_grad_hook(self._grad_hook(k))
                _free(p)
                shards.append(shard)
            unit.module.register_forward_pre_hook(self._pre_forward(k))
            unit.module.register_forward_hook(self._post_forward(k))
            self.param_shards.append(pshard)
        return shards

    # --- gather and free ----------------------------------------------------------------
    def _gather(self, k: int) -> None:
        """All-gather unit ``k``'s full parameters into their (re-allocated) storage."""
        if self._gathered[k]:
            return
        unit = self.units[k]
        with torch.no_grad():
            full = all_gather_unit(unit, self.param_shards[k], self.dp_world_size, self.group)
            for p, f in zip(unit.params, full, strict=True):
                _alloc(p)
                p.data.copy_(f)  # .data: autograd's version counter of p is left alone
            self._gathered[k] = True
            self.observe(extra=full)

    def _release(self, k: int) -> None:
        for p in self.units[k].params:
            _free(p)
        self._gathered[k] = False

    def _swap(self, unit: Unit, params: list[nn.Parameter]) -> None:
        for name, p in zip(unit.names, params, strict=True):
            unit.module._parameters[name] = p  # no checks: a full parameter replaces a shard

    # --- hooks --------------------------------------------------------------------------
    def _pre_forward(self, k: int):
        def hook(module: nn.Module, args: Any) -> None:
            self._gather(k)
            self._swap(self.units[k], self.units[k].params)

        return hook

    def _post_forward(self, k: int):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            unit = self.units[k]
            a = sum(len(u.params) for u in self.units[:k])
            self._swap(unit, self.shards[a : a + len(unit.params)])
            self._release(k)
            outs = output if isinstance(output, tuple | list) else (output,)
            needs = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
            for o in needs[:1]:  # gather before the unit's backward runs
                o.register_hook(lambda grad: self._gather(k))

        return hook

    def _grad_hook(self, k: int):
        def hook(p: torch.Tensor) -> None:
            if self.gradients.arrive(k):
                if self.sync:  # under no_sync() the full gradients stay and accumulate
                    self.gradients.reduce(k)  # the full gradients are freed ...
                self._release(k)  # ... and so are the full parameters, until the next gather

        return hook

    # --- bytes held, the training loop ----------------------------------------------------
    def _param_tensors(self) -> list[torch.Tensor | None]:
        return [*self.param_shards, *self.full_params]

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
        """Adam on this rank's shards; no communication (the next forward gathers)."""
        self.gradients.check_all_reduced()
        self.optimizer.step()
        self.observe()

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter in full (one all-gather per unit: call it on every rank).

        Returns:
            ``{qualified name: tensor}`` in registration order (copies).
        """
        out = {}
        for k, unit in enumerate(self.units):
            full = all_gather_unit(unit, self.param_shards[k], self.dp_world_size, self.group)
            for name, f in zip(unit.names, full, strict=True):
                out[f"{unit.name}.{name}" if unit.name else name] = f.clone()
        return out
