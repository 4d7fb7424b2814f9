"""The router of a mixture of experts: softmax gate, top-k, capacity, the load-balancing loss.

Introduced in notebooks/17_expert_parallel.ipynb.

A token ``x`` (width ``d``) gets router logits ``h = x W_r`` over ``E`` experts and the gate
``p = softmax(h)`` (computed in float32, Switch's "selective precision", Fedus et al. 2021,
§2.4). It goes to its ``k`` most probable experts with weights:

- **top-1, not renormalised** — Switch Transformer (Fedus et al. 2021, §2.1, eq. 2):
  ``y = p_i(x) E_i(x)``; renormalising one weight would make it 1 and cut the router off from
  the loss's gradient;
- **top-2, renormalised** — GShard (Lepikhin et al. 2020, Algorithm 1):
  ``g1, g2 = p_1/(p_1 + p_2), p_2/(p_1 + p_2)``. GShard sends the second token to its expert
  only with probability ``2·g2``; that random step is left out here, so every run is exact.

``normalize=None`` picks the paper's choice from ``k`` (False for 1, True for more).

**Capacity and drops, deterministic.** Each expert takes at most ``C`` assignments of a group
(``labkit.costmodel.expert_capacity``). Priority follows GShard's Algorithm 1: every token's
first choice before any token's second choice, and within a choice the tokens in order (its
``cumsum`` of the one-hot masks). Assignments past ``C`` are dropped: their weight counts as 0,
and with a residual connection the token passes through unchanged (Switch, §2.2). Weights are
normalised before drops, as in GShard.

**Load-balancing loss** (Switch, §2.2, eq. 4–6): ``N · Σ_i f_i · P_i`` with ``f_i`` the share
of tokens whose top-1 expert is ``i`` (counted, no gradient) and ``P_i`` the mean gate
probability of expert ``i`` (differentiable). It is 1 when routing is uniform and grows as
tokens crowd onto few experts; the model adds ``α`` times it to its loss (α = 10⁻² in Switch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from labkit.costmodel.moe import expert_capacity

__all__ = ["Routing", "TopKRouter", "dispatch_order", "load_balancing_loss", "route"]


@dataclass
class Routing:
    """Where a group of ``T`` tokens goes: ``k`` experts each, with weights and drops.

    Attributes:
        probs: ``[T, E]`` gate probabilities (float32, differentiable).
        experts: ``[T, k]`` chosen experts, most probable first.
        weights: ``[T, k]`` combine weights (renormalised or not), differentiable.
        position: ``[T, k]`` the assignment's place in its expert's buffer (priority order).
        kept: ``[T, k]`` True where ``position < capacity``; False = dropped.
        capacity: ``C``, assignments per expert.
    """

    probs: torch.Tensor
    experts: torch.Tensor
    weights: torch.Tensor
    position: torch.Tensor
    kept: torch.Tensor
    capacity: int

    @property
    def n_experts(self) -> int:
        """``E``."""
        return self.probs.shape[-1]

    def tokens_per_expert(self) -> torch.Tensor:
        """``[E]`` int64: the kept assignments of each expert (each ≤ capacity)."""
        return torch.bincount(self.experts[self.kept], minlength=self.n_experts)


def route(
    logits: torch.Tensor, top_k: int, capacity: int, normalize: bool | None = None
) -> Routing:
    """Softmax gate, top-k, optional renormalisation, then capacity in GShard's priority order.

    Args:
        logits: ``[T, E]`` router logits of one group of tokens.
        top_k: experts per token ``k``.
        capacity: assignments each expert accepts (``expert_capacity``).
        normalize: renormalise the ``k`` weights to sum to 1; None: only when ``k > 1``
            (Switch for ``k = 1``, GShard for ``k = 2``).

    Returns:
        Routing: the group's routing (module docstring).

    Raises:
        ValueError: ``top_k`` not in ``1..E``.
    """
    n_tokens, n_experts = logits.shape
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k must be in 1..{n_experts}, got {top_k}")
    probs = logits.float().softmax(dim=-1)  # [T, E]
    weights, experts = probs.topk(top_k, dim=-1)  # [T, k], most probable first
    if normalize if normalize is not None else top_k > 1:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    # GShard priority: choice 0 of every token, then choice 1, ...; tokens in order within one
    onehot = F.one_hot(experts.t().reshape(-1), n_experts)  # [k·T, E]
    position = ((onehot.cumsum(dim=0) - 1) * onehot).sum(dim=-1)  # place in its expert's buffer
    position = position.view(top_k, n_tokens).t()  # [T, k]
    return Routing(probs, experts, weights, position, position < capacity, capacity)


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Switch's auxiliary loss ``N · Σ_i f_i · P_i`` (Fedus et al. 2021, §2.2, eq. 4–6).

    Args:
        probs: ``[T, E]`` gate probabilities.
        experts: ``[T, k]`` chosen experts; ``f`` counts the first choice (Switch's argmax;
            GShard's ``c_e`` also counts top-1).

    Returns:
        torch.Tensor: a scalar, 1.0 for perfectly balanced routing; gradient through ``P``;
        0 for a group without tokens (a rank may get none).
    """
    n_experts = probs.shape[-1]
    if probs.shape[0] == 0:
        return probs.sum()  # 0, still in the graph
    f = torch.bincount(experts[:, 0], minlength=n_experts).to(probs.dtype) / probs.shape[0]
    return n_experts * (f * probs.mean(dim=0)).sum()


def dispatch_order(routing: Routing) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kept assignments sorted by expert, then by buffer position: the order they travel.

    Args:
        routing: a group's routing.

    Returns:
        ``(tokens, choices, counts)``: ``[S]`` token index and ``[S]`` choice index of each
        kept assignment, expert-major; ``[E]`` assignments per expert.
    """
    tokens, choices = routing.kept.nonzero(as_tuple=True)
    expert = routing.experts[tokens, choices]
    key = expert * routing.kept.numel() + routing.position[tokens, choices]  # unique per pair
    order = torch.argsort(key)
    return tokens[order], choices[order], routing.tokens_per_expert()


class TopKRouter(nn.Module):
    """The gate: a bias-free linear map to ``E`` logits, then ``route``.

    Args:
        d_model: token width ``d``.
        n_experts: experts ``E``.
        top_k: experts per token ``k`` (1: Switch, 2: GShard).
        capacity_factor: ``f`` of ``expert_capacity``; None: no token dropped.
        normalize: see ``route`` (None: the paper's choice for ``k``).
        seed: initialisation seed (the same weights on every rank).

    Raises:
        ValueError: ``top_k`` not in ``1..n_experts``.
    """

    def __init__(
        self,
        d_model: int,
        n_experts: int,
        top_k: int = 1,
        capacity_factor: float | None = 1.0,
        normalize: bool | None = None,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in 1..{n_experts}, got {top_k}")
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)  # the same gate on every rank, global RNG untouched
            self.gate = nn.Linear(d_model, n_experts, bias=False)
        self.n_experts, self.top_k = n_experts, top_k
        self.capacity_factor, self.normalize = capacity_factor, normalize

    def forward(self, x: torch.Tensor) -> Routing:
        """Route a group of tokens ``x`` ``[T, d]`` with the group's capacity."""
        capacity = expert_capacity(x.shape[0], self.n_experts, self.top_k, self.capacity_factor)
        return route(self.gate(x), self.top_k, capacity, self.normalize)
