"""Learning-rate scaling for large global batches: the linear scaling rule with gradual warmup.

Introduced in notebooks/09_accumulation_and_precision.ipynb.

Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour":

- §2.1 linear scaling rule: "when the minibatch size is multiplied by k, multiply the learning
  rate by k" — lr = base_lr · global_batch / base_batch;
- §2.2 gradual warmup: start from base_lr and raise the learning rate by a constant amount
  every iteration until it reaches k · base_lr after the warmup (5 epochs in the paper), because
  the first iterations change the weights fast and a large learning rate there diverges;
- then the usual schedule (their ImageNet runs divide it by 10 at epochs 30, 60 and 80, §5.1:
  ``milestones``).

The schedule is a multiplier of the optimizer's learning rate, so the optimizer is built with
the *base* learning rate (the one tuned for ``base_batch``) and the scheduler scales it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["linear_scaling_warmup", "lr_factor", "scaled_lr"]


def scaled_lr(base_lr: float, global_batch: int, base_batch: int) -> float:
    """The linear scaling rule: the learning rate for ``global_batch``.

    Introduced in notebooks/09_accumulation_and_precision.ipynb.
    Goyal et al. 2017, §2.1: lr = base_lr · global_batch / base_batch.

    Args:
        base_lr: learning rate tuned for ``base_batch``.
        global_batch: samples per optimizer step over all ranks (ranks × micro-batches ×
            micro-batch size).
        base_batch: the batch size ``base_lr`` was tuned for.

    Returns:
        The scaled learning rate.

    Raises:
        ValueError: a batch size is not positive or ``base_lr`` is negative.
    """
    if global_batch <= 0 or base_batch <= 0 or base_lr < 0:
        raise ValueError(
            f"need batches > 0 and base_lr >= 0, got {global_batch=}, {base_batch=}, {base_lr=}"
        )
    return base_lr * global_batch / base_batch


def lr_factor(
    step: int,
    scale: float,
    warmup_steps: int,
    milestones: Sequence[int] = (),
    gamma: float = 0.1,
) -> float:
    """The multiplier of the base learning rate at optimizer step ``step`` (0-based).

    Introduced in notebooks/09_accumulation_and_precision.ipynb.
    Goyal et al. 2017, §2.2 (gradual warmup); step decay at milestones as in their §5.1.

    During warmup (step < warmup_steps) it rises linearly from 1 at step 0 towards ``scale``:
    1 + (scale − 1) · step / warmup_steps; from ``warmup_steps`` on it is ``scale``, times
    ``gamma`` for every milestone already reached.

    Args:
        step: optimizer steps taken so far.
        scale: global_batch / base_batch (k in the paper).
        warmup_steps: steps of the warmup (0: none — the full ``scale`` from the start).
        milestones: steps at which the rate is multiplied by ``gamma``.
        gamma: decay factor at each milestone.

    Returns:
        The factor: lr(step) = base_lr · factor.

    Raises:
        ValueError: a negative step, warmup or scale.
    """
    if step < 0 or warmup_steps < 0 or scale <= 0:
        raise ValueError(f"need step >= 0, warmup_steps >= 0, scale > 0: {step=}, {warmup_steps=}")
    if step < warmup_steps:
        return 1.0 + (scale - 1.0) * step / warmup_steps
    return scale * gamma ** sum(step >= m for m in milestones)


def linear_scaling_warmup(
    optimizer: torch.optim.Optimizer,
    global_batch: int,
    base_batch: int,
    warmup_steps: int,
    milestones: Sequence[int] = (),
    gamma: float = 0.1,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler applying the linear scaling rule with gradual warmup (Goyal et al. 2017).

    Introduced in notebooks/09_accumulation_and_precision.ipynb.

    Build the optimizer with the learning rate tuned for ``base_batch``; after creating this
    scheduler, its rate is that base rate (step 0) and it reaches base · global_batch /
    base_batch after ``warmup_steps`` calls of ``scheduler.step()`` (one per optimizer step).
    Each parameter group is scaled from its own base rate.

    Args:
        optimizer: the optimizer, built with the base learning rate.
        global_batch: samples per optimizer step over all ranks.
        base_batch: the batch size the base learning rate was tuned for.
        warmup_steps: optimizer steps of linear warmup (the paper: 5 epochs' worth).
        milestones: optimizer steps at which the rate is multiplied by ``gamma``.
        gamma: decay factor at each milestone.

    Returns:
        ``torch.optim.lr_scheduler.LambdaLR`` with factor ``lr_factor(step, ...)``.

    Raises:
        ValueError: a batch size is not positive or ``warmup_steps`` is negative.
    """
    scale = scaled_lr(1.0, global_batch, base_batch)
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    milestones = tuple(milestones)

    def factor(step: int) -> float:
        return lr_factor(step, scale, warmup_steps, milestones, gamma)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
