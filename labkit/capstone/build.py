"""One rank's share of the capstone model under a strategy: the dispatch to each technique.

Introduced in notebooks/17_capstone.ipynb. Data parallelism (``DataParallelBucketed``) is built
here; ZeRO, FSDP2, tensor and pipeline parallelism in ``labkit.capstone.sharded``, from the
pieces in ``labkit.capstone.setups``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from labkit.capstone import sharded
from labkit.capstone.setups import Groups, RankSetup, evaluator, lm_loss, state_bytes
from labkit.capstone.strategy import Strategy
from labkit.models import TinyGPT
from labkit.parallel.ddp import DataParallelBucketed

__all__ = ["make_setup"]


def make_setup(
    strategy: Strategy, groups: Groups, make_model: Callable[[], TinyGPT], lr: float
) -> RankSetup:
    """Build this rank's part of the model under ``strategy``, with Adam at ``lr``.

    Introduced in notebooks/17_capstone.ipynb.

    Args:
        strategy: the strategy.
        groups: this rank's groups (``make_groups``).
        make_model: builds the same TinyGPT on every rank (same seed).
        lr: Adam's learning rate.

    Returns:
        The ``RankSetup``.
    """
    s = strategy
    if s.pp > 1:
        return sharded.pipeline_setup(s, groups, make_model, lr)
    if s.tp > 1:
        return sharded.tensor_setup(s, groups, make_model, lr)
    if s.fsdp:
        return sharded.fsdp_setup(groups, make_model, lr)
    if s.zero_stage:
        return sharded.zero_setup(s, groups, make_model, lr)
    model = make_model()
    ddp = DataParallelBucketed(model, group=groups.dp)
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=lr)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        opt.zero_grad(set_to_none=False)
        loss = lm_loss(ddp(x), y)
        loss.backward()  # buckets all-reduced (averaged) during backward
        opt.step()
        return loss.item()

    def full_state() -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in model.named_parameters()}

    return RankSetup(step, evaluator(model), lambda: state_bytes(params, opt), full_state)
