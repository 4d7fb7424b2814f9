"""Expert parallelism: each rank of an ep group holds ``E/ep`` experts; tokens travel to them.

Introduced in notebooks/17_expert_parallel.ipynb.

``ExpertParallelMoE(layer, group)`` keeps the router (replicated) and this rank's experts of a
``MoELayer`` (the same module objects, so gradients land in the whole layer's parameters and
compare by name with one process). Its forward on this rank's tokens:

1. route locally (the rank's tokens are one GShard group: local capacity, local drops);
2. sort the kept assignments by expert (``dispatch_order``) — experts of rank ``j`` are
   ``j·E/ep …``, so the rows are grouped by destination rank;
3. ``exchange_counts``: every rank learns how many rows it gets, per local expert;
4. ``all_to_all`` the rows (uneven splits), run each local expert on its rows from every rank;
5. ``all_to_all`` the outputs back (splits swapped) and ``combine`` with the gate weights.

Backward runs the two exchanges in reverse (``labkit.parallel.moe.dispatch``).

**EP × DP** (``ParallelDims.expert_groups``): the dense layers and the router are replicated
over the dp group; the experts over the expert-dp group (ranks ``ep`` apart).
``reduce_ep_gradients`` sums each over its group and divides both by the dp degree: the loss
is the mean over the dp ranks' tokens, and an expert's gradient on a rank already holds the
contributions of every rank of its ep group (the all-to-all's backward brought them), so the
expert-dp sum covers each dp rank once. Averaging the experts over the expert-dp group instead
gives gradients ``ep`` times too large.

Why ``apply_ep`` is here and not in ``labkit.parallel.compose``: in torchtitan's order it would
come after tp and before ac and dp, but the dp flavours there (``apply_ddp``, ``apply_zero``,
``apply_fsdp``) reduce every parameter over one dp group with one divisor, and experts need
another group (torchtitan shards them with a separate ``fully_shard`` on its
``dp_shard_mod_ep`` mesh and a gradient divide factor). ``reduce_ep_gradients`` is that second
reduction, written out.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from labkit.parallel.moe.dispatch import all_to_all, exchange_counts
from labkit.parallel.moe.layer import MoELayer, combine
from labkit.parallel.moe.router import Routing, dispatch_order, load_balancing_loss

__all__ = ["ExpertParallelMoE", "apply_ep", "expert_parameters", "reduce_ep_gradients"]


class ExpertParallelMoE(nn.Module):
    """This rank's share of a ``MoELayer``: the router and ``E/ep`` experts.

    After each forward: ``aux_loss`` (this rank's load-balancing loss), ``routing`` (this
    rank's ``Routing``), ``received`` (``[ep, E/ep]``: rows each rank sent to each local expert).

    Args:
        layer: the whole layer, identical on every rank (same seed).
        group: the ep group (None: the default group).
        impl: how rows move: ``"p2p"``, ``"collective"`` or ``"torch"`` (``all_to_all``).

    Raises:
        ValueError: the experts do not divide evenly over the group.
    """

    def __init__(
        self, layer: MoELayer, group: dist.ProcessGroup | None = None, impl: str = "collective"
    ) -> None:
        super().__init__()
        self.ep, rank = dist.get_world_size(group), dist.get_rank(group)
        n_experts = len(layer.experts)
        if n_experts % self.ep:
            raise ValueError(f"{n_experts} experts do not divide over {self.ep} ep ranks")
        self.n_local = n_experts // self.ep
        self.first_expert = rank * self.n_local
        self.router = layer.router
        self.experts = nn.ModuleList(
            layer.experts[self.first_expert : self.first_expert + self.n_local]
        )
        self.group, self.impl = group, impl
        self.aux_loss: torch.Tensor | None = None
        self.routing: Routing | None = None
        self.received: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Route this rank's tokens, send them to their experts, combine what comes back.

        Args:
            x: ``[..., d]`` this rank's tokens (one group).

        Returns:
            torch.Tensor: the same shape as ``x``.
        """
        flat = x.reshape(-1, x.shape[-1])
        r = self.router(flat)
        tokens, choices, counts = dispatch_order(r)  # counts: [E] on x's device
        received = exchange_counts(counts, self.group).view(self.ep, self.n_local)
        send_splits = counts.view(self.ep, self.n_local).sum(dim=1).tolist()
        recv_splits = received.sum(dim=1).tolist()
        rows = all_to_all(flat[tokens], recv_splits, send_splits, self.group, self.impl)
        out = self._run_local_experts(rows, received.tolist())
        back = all_to_all(out, send_splits, recv_splits, self.group, self.impl)
        self.aux_loss = load_balancing_loss(r.probs, r.experts)
        self.routing, self.received = r, received
        return combine(flat, tokens, r.weights[tokens, choices], back).view(x.shape)

    def _run_local_experts(self, rows: torch.Tensor, sizes: list[list[int]]) -> torch.Tensor:
        """Rows arrive source-major (``[source][expert]``); each expert takes its rows from
        every source at once, and the outputs go back into the arrival order."""
        ep, n = self.ep, self.n_local
        chunks = rows.split([k for per_source in sizes for k in per_source])
        outs = [
            expert(torch.cat([chunks[s * n + e] for s in range(ep)]))
            for e, expert in enumerate(self.experts)
        ]
        parts = [o.split([sizes[s][e] for s in range(ep)]) for e, o in enumerate(outs)]
        return torch.cat([parts[e][s] for s in range(ep) for e in range(n)])


def apply_ep(
    model: nn.Module, ep: dist.ProcessGroup | None = None, impl: str = "collective"
) -> nn.Module:
    """Replace every ``MoELayer`` in ``model`` by this rank's ``ExpertParallelMoE``, in place.

    Args:
        model: the whole model, identical on every rank.
        ep: the ep group (``ParallelDims.expert_groups``; None: the default group).
        impl: as ``ExpertParallelMoE``.

    Returns:
        ``model``; its other layers are untouched (replicated).

    Raises:
        ValueError: ``model`` has no ``MoELayer`` (or it is the model itself).
    """
    names = [n for n, m in model.named_modules() if isinstance(m, MoELayer)]
    if not names or "" in names:
        raise ValueError("apply_ep needs a model that contains MoELayer submodules")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, ExpertParallelMoE(getattr(parent, child), ep, impl))
    return model


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of the experts this rank holds (every ``ExpertParallelMoE`` in ``model``).

    Args:
        model: a model after ``apply_ep``.

    Returns:
        list[nn.Parameter]: in module order.
    """
    return [
        p
        for m in model.modules()
        if isinstance(m, ExpertParallelMoE)
        for p in m.experts.parameters()
    ]


def reduce_ep_gradients(
    model: nn.Module, dp: dist.ProcessGroup | None, edp: dist.ProcessGroup | None
) -> None:
    """Sum dense gradients over dp and expert gradients over expert-dp; divide both by dp.

    One all-reduce per kind, each over one flat buffer (none when the group has one rank).

    Args:
        model: a model after ``apply_ep``, after ``backward`` of this rank's mean loss.
        dp: the data-parallel group (the dense layers' and the router's replicas).
        edp: the expert-dp group (the ranks holding the same experts).

    Returns:
        None. Every ``.grad`` holds the gradient of the mean loss over all dp ranks' tokens.
    """
    n_dp = dist.get_world_size(dp)
    experts = expert_parameters(model)
    ids = {id(p) for p in experts}
    dense = [p for p in model.parameters() if id(p) not in ids]
    for params, group in ((dense, dp), (experts, edp)):
        if not params:
            continue
        for p in params:
            if p.grad is None:  # an expert that got no token still takes part in the sum
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        if dist.get_world_size(group) > 1:
            dist.all_reduce(flat, group=group)
        flat /= n_dp
        for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(g.view_as(p))
