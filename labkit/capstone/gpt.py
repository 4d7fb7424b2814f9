"""TinyGPT under a strategy: its loss, its pipeline stages, its tensor-parallel plan, composed.

Introduced in notebooks/21_capstone.ipynb.

What is model-specific lives here, as torchtitan keeps ``models/llama3/infra/parallelize.py``
apart from ``distributed/``: where a TinyGPT is cut into stages (``gpt_stages``: Megatron's
placement of the embedding and the head), which of its linear layers split (``gpt_tp_plan``:
Megatron's block plan), which blocks recompute their activations. ``parallelize_gpt`` hands
them to the model-agnostic ``labkit.parallel.compose.parallelize``, which applies pp, tp, ac
and dp in its one order.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from labkit.capstone.strategy import Strategy
from labkit.models import TinyGPT
from labkit.parallel.compose import Parallelized, parallelize
from labkit.parallel.tensor import block_plan

__all__ = ["dp_flavour", "gpt_stages", "gpt_tp_plan", "lm_loss", "parallelize_gpt"]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits (B, T, V) against targets (B, T)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten().long())


def gpt_stages(model: TinyGPT, pp: int) -> list[nn.Sequential]:
    """Cut a TinyGPT into ``pp`` stages of L/pp blocks; the embedding joins the first stage and
    the head the last (Megatron-LM's placement: Narayanan et al. 2021, §2.2).

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


def gpt_tp_plan(model: TinyGPT) -> dict[str, str]:
    """Megatron's plan for every block of ``model``: heads and MLP split; embeddings,
    LayerNorms and the head whole (``block_plan`` of notebook 12, blocks ``"1"`` … ``"L"``)."""
    plan: dict[str, str] = {}
    for i in range(1, model.n_layers + 1):
        plan |= block_plan(f"{i}.attn", f"{i}.mlp")
    return plan


def dp_flavour(strategy: Strategy) -> str:
    """The data-parallel flavour of ``strategy``: ``"ddp"``, ``"zero1"`` … or ``"fsdp"``."""
    if strategy.fsdp:
        return "fsdp"
    return f"zero{strategy.zero_stage}" if strategy.zero_stage else "ddp"


def parallelize_gpt(
    model: TinyGPT, strategy: Strategy, mesh: Any, seq_len: int, lr: float
) -> Parallelized:
    """This rank's share of ``model`` under ``strategy``: ``parallelize`` with TinyGPT's facts.

    Args:
        model: the whole TinyGPT, the same on every rank, on this rank's device.
        strategy: the degrees, the dp flavour, the micro-batches, activation checkpointing.
        mesh: ``labkit.mesh.build_mesh(strategy.dims)``.
        seq_len: T, tokens per sequence (the pipeline's activation shapes).
        lr: Adam's learning rate (ZeRO builds its Adam now).

    Returns:
        The ``Parallelized`` share; ``.chain`` lists the ``apply_*`` calls made.
    """
    s = strategy
    device = next(model.parameters()).device
    return parallelize(
        model,
        s.dims,
        mesh,
        dp=dp_flavour(s),
        tp_plan=gpt_tp_plan(model),
        tp_style="dtensor" if s.fsdp else "megatron",
        ac=[str(i) for i in range(1, model.n_layers + 1)] if s.ac else (),
        microbatches=s.microbatches if s.pp > 1 else 1,
        example=torch.zeros(1, seq_len, dtype=torch.long, device=device),
        split=gpt_stages,
        optimizer_kwargs={"lr": lr},
    )
