"""One rank's share of a TinyGPT under a ``Strategy``: its step, evaluation, bytes and full state.

Introduced in notebooks/17_capstone.ipynb. Each setup reuses the course's techniques:
``lk.parallel.ddp.DataParallelBucketed`` (dp), ``lk.parallel.zero.ZeroOptimizer`` (ZeRO-1/2/3),
``apply_fully_shard`` (FSDP2), ``apply_tensor_parallel`` with Megatron's block plan (tp),
``run_schedule`` with 1F1B (pp); data parallelism across tp or pp groups averages the
gradients with one all-reduce per parameter (notebook 06's from-scratch DDP).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit.capstone.strategy import Strategy
from labkit.models import TinyGPT
from labkit.parallel.zero.base import storage_bytes

__all__ = [
    "Groups",
    "RankSetup",
    "average_grads",
    "evaluator",
    "gpt_stages",
    "lm_loss",
    "make_groups",
    "plain_step",
    "state_bytes",
]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits (B, T, V) against targets (B, T).

    Introduced in notebooks/17_capstone.ipynb.
    """
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten().long())


def gpt_stages(model: TinyGPT, pp: int) -> list[nn.Sequential]:
    """Cut a TinyGPT into ``pp`` stages of L/pp blocks; the embedding joins the first stage and
    the head the last (Megatron-LM's placement: Narayanan et al. 2021, §2.2).

    Introduced in notebooks/17_capstone.ipynb.

    Args:
        model: the model (stages share its layers).
        pp: stages; must divide the number of blocks.

    Returns:
        The stages, in order.

    Raises:
        ValueError: ``pp`` does not divide the number of blocks.
    """
    L = model.n_layers
    if pp < 1 or L % pp:
        raise ValueError(f"pp({pp}) must divide n_layers({L})")
    k = L // pp
    bounds = [0] + [1 + k * (s + 1) for s in range(pp - 1)] + [L + 2]
    return [nn.Sequential(*list(model)[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


class Groups:
    """This rank's coordinates and its data-, pipeline- and tensor-parallel groups.

    The groups are ``strategy.dims.groups(axis)`` (``labkit.parallel.dims.ParallelDims``, tp
    innermost). Every rank creates every group, in the same order (``dist.new_group`` is
    collective), each with the run's timeout.

    Introduced in notebooks/17_capstone.ipynb.

    Args:
        strategy: the degrees.
        rank: this rank's global rank.
        timeout_s: timeout of every group's collectives.
    """

    def __init__(self, strategy: Strategy, rank: int, timeout_s: float) -> None:
        dims, t = strategy.dims, timedelta(seconds=timeout_s)
        self.dp_rank, self.pp_rank, self.tp_rank = strategy.coords(rank)

        def pick(axis: str) -> dist.ProcessGroup:
            mine = None
            for members in dims.groups(axis):  # the same order on every rank
                g = dist.new_group(members, timeout=t)
                mine = g if rank in members else mine
            return mine

        self.dp, self.pp, self.tp = pick("dp"), pick("pp"), pick("tp")


def make_groups(strategy: Strategy, rank: int, timeout_s: float = 60.0) -> Groups:
    """Create the process groups of ``strategy`` (call on every rank). See ``Groups``.

    Introduced in notebooks/17_capstone.ipynb.
    """
    return Groups(strategy, rank, timeout_s)


class RankSetup:
    """What the training loop needs from one rank, whatever the strategy.

    Introduced in notebooks/17_capstone.ipynb.

    Attributes:
        step: ``step(x, y)`` runs forward, backward and the optimizer on this rank's share of
            the batch (its dp slice); returns the loss if this rank computes it, else None.
        evaluate: ``evaluate(x, y)`` the loss without gradients (same convention).
        state_bytes: ``{"params", "grads", "optimizer"}`` bytes this rank holds (distinct
            storages counted, as notebook 13 does).
        full_state: collective; every parameter in full, by the unsplit model's names.
    """

    def __init__(
        self,
        step: Callable[[torch.Tensor, torch.Tensor], float | None],
        evaluate: Callable[[torch.Tensor, torch.Tensor], float | None],
        state_bytes: Callable[[], dict[str, int]],
        full_state: Callable[[], dict[str, torch.Tensor]],
    ) -> None:
        self.step, self.evaluate = step, evaluate
        self.state_bytes, self.full_state = state_bytes, full_state


def state_bytes(params: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds in parameters, gradients and optimizer state (each storage once)."""
    seen: set[int] = set()
    states = [t for st in optimizer.state.values() for t in st.values()]
    return {
        "params": storage_bytes(params, seen),
        "grads": storage_bytes([p.grad for p in params], seen),
        "optimizer": storage_bytes([t for t in states if isinstance(t, torch.Tensor)], seen),
    }


def average_grads(params: list[torch.Tensor], group: dist.ProcessGroup, n: int) -> None:
    """Average every gradient over the ``n`` ranks of ``group``: one all-reduce per tensor."""
    if n > 1:
        for p in params:
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(n)


def plain_step(model, params, opt, groups, n_dp) -> Callable:
    """A training step: forward, backward, gradients averaged over ``groups.dp``, Adam."""

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        opt.zero_grad(set_to_none=False)
        loss = lm_loss(model(x), y)
        loss.backward()
        average_grads(params, groups.dp, n_dp)
        opt.step()
        return loss.item()

    return step


def evaluator(model: nn.Module) -> Callable:
    """The loss of ``model`` on a batch, without gradients."""

    @torch.no_grad()
    def evaluate(x: torch.Tensor, y: torch.Tensor) -> float:
        return lm_loss(model(x), y).item()

    return evaluate
