"""A mixture-of-experts layer on one process: the reference expert parallelism must equal.

Introduced in notebooks/17_expert_parallel.ipynb.

``MoELayer`` = a ``TopKRouter`` + ``E`` experts, each a transformer MLP
(``lk.models.FeedForward``). Forward, for each group of tokens:

1. route (``labkit.parallel.moe.router``): ``k`` experts per token, weights, drops;
2. **dispatch**: the kept assignments, sorted by expert (``dispatch_order``), gather their
   tokens — ``[S, d]``, expert-major;
3. each expert runs on its contiguous rows (``run_experts``);
4. **combine**: ``y_t = Σ_j w_tj · E_{e_tj}(x_t)`` over the token's kept choices
   (``combine``); a dropped assignment adds nothing.

**Groups.** Capacity and the load-balancing loss are per *group* of tokens (GShard, Lepikhin
et al. 2020, §3.2: tokens are split into groups, each dispatched on its own). Under expert
parallelism a rank's tokens are its group, so ``forward(x, n_groups=ranks)`` on one process
is the exact reference: the same capacity, the same drops, the aux loss the mean of the
groups'. With ``n_groups=1`` the whole batch is one group (Switch's single-device view).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from labkit.models import FeedForward
from labkit.parallel.moe.router import Routing, TopKRouter, dispatch_order, load_balancing_loss

__all__ = ["MoELayer", "combine", "run_experts"]


def run_experts(rows: torch.Tensor, counts: Sequence[int], experts: Sequence[nn.Module]):
    """Run expert ``e`` on its ``counts[e]`` consecutive rows of ``rows``.

    Args:
        rows: ``[Σ counts, d]``, expert-major.
        counts: rows per expert, in the order of ``experts``.
        experts: the experts.

    Returns:
        torch.Tensor: ``[Σ counts, d]``, each row replaced by its expert's output.
    """
    chunks = rows.split(list(counts))
    return torch.cat([e(c) for e, c in zip(experts, chunks, strict=True)])


def combine(
    x: torch.Tensor, tokens: torch.Tensor, weights: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """``y_t = Σ w · out`` over the rows that belong to token ``t``; zero for dropped tokens.

    Args:
        x: ``[T, d]`` the tokens (for the shape, dtype and device of ``y``).
        tokens: ``[S]`` the token of each row of ``out``.
        weights: ``[S]`` the combine weight of each row.
        out: ``[S, d]`` the experts' outputs.

    Returns:
        torch.Tensor: ``[T, d]``.
    """
    return torch.zeros_like(x).index_add(0, tokens, out * weights.to(out.dtype)[:, None])


class MoELayer(nn.Module):
    """Router and experts on one process (Shazeer et al. 2017's sparsely gated MoE layer).

    After each forward, ``aux_loss`` holds the load-balancing loss (the mean over groups) and
    ``routing`` the ``Routing`` of each group.

    Args:
        d_model: token width ``d``.
        n_experts: experts ``E``.
        d_ff: each expert's inner width.
        top_k: experts per token (1: Switch, 2: GShard).
        capacity_factor: ``f``; None: no token dropped.
        normalize: renormalise the top-k weights (None: only when ``k > 1``).
        seed: initialisation seed: the router from ``seed``, expert ``e`` from ``seed + 1 + e``.
    """

    def __init__(
        self,
        d_model: int,
        n_experts: int,
        d_ff: int,
        top_k: int = 1,
        capacity_factor: float | None = 1.0,
        normalize: bool | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.router = TopKRouter(d_model, n_experts, top_k, capacity_factor, normalize, seed)
        self.experts = nn.ModuleList(
            FeedForward(d_model, d_ff, seed=seed + 1 + e) for e in range(n_experts)
        )
        self.aux_loss: torch.Tensor | None = None
        self.routing: list[Routing] = []

    def forward(self, x: torch.Tensor, n_groups: int = 1) -> torch.Tensor:
        """Route, dispatch, run the experts and combine, group by group.

        Args:
            x: ``[..., d]`` tokens; flattened to ``[T, d]``.
            n_groups: equal groups the ``T`` tokens are cut into, in order (one per rank of
                an expert-parallel run).

        Returns:
            torch.Tensor: the same shape as ``x``.

        Raises:
            ValueError: ``T`` is not a multiple of ``n_groups``.
        """
        flat = x.reshape(-1, x.shape[-1])
        if n_groups < 1 or flat.shape[0] % n_groups:
            raise ValueError(f"{flat.shape[0]} tokens do not split into {n_groups} equal groups")
        ys, aux, self.routing = [], [], []
        for xg in flat.split(flat.shape[0] // n_groups):
            r = self.router(xg)
            tokens, choices, counts = dispatch_order(r)
            out = run_experts(xg[tokens], counts.tolist(), self.experts)
            ys.append(combine(xg, tokens, r.weights[tokens, choices], out))
            aux.append(load_balancing_loss(r.probs, r.experts))
            self.routing.append(r)
        self.aux_loss = torch.stack(aux).mean()
        return torch.cat(ys).view(x.shape)
