"""Learning rates for large global batches: scaling rules, gradual warmup, and decay.

Introduced in notebooks/09_accumulation_and_precision.ipynb.

Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour":

- §2.1 linear scaling rule (for SGD): "when the minibatch size is multiplied by k, multiply
  the learning rate by k" — lr = base_lr · global_batch / base_batch;
- §2.2 gradual warmup: start from base_lr and raise the learning rate by a constant amount
  every iteration until it reaches k · base_lr after the warmup (5 epochs in the paper), because
  the first iterations change the weights fast and a large learning rate there diverges;
- then the usual schedule (their ImageNet runs divide it by 10 at epochs 30, 60 and 80, §5.1:
  ``milestones``).

Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms"
(NeurIPS), derive the square-root scaling rule for Adam and RMSprop from their SDE
approximations: batch × κ → learning rate × √κ, 1 − β₁ and 1 − β₂ × κ, ε ÷ √κ
(``sqrt_scaled_adam``; ``scaled_lr(..., rule="sqrt")`` is its learning-rate part). For SGD the
same SDE view gives the linear rule; the earlier √ rule for SGD (Krizhevsky 2014; Hoffer et al.
2017, "Train longer, generalize better", §4) kept the variance of one step's update instead.

After the warmup the rate decays to ``final_fraction`` of its peak at ``total_steps``, linearly
or along a half cosine (Loshchilov & Hutter 2017, "SGDR", eq. 5, without restarts):
``lr_factor(..., decay="linear" | "cosine")``. ``torch_warmup_decay`` builds the same schedule
from ``torch.optim.lr_scheduler`` (``SequentialLR`` of ``LinearLR`` and ``CosineAnnealingLR``
or ``LinearLR``); tests/test_optim.py checks the two agree at every step.

The schedule is a multiplier of the optimizer's learning rate, so the optimizer is built with
the *base* learning rate (the one tuned for ``base_batch``) and the scheduler scales it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = [
    "DECAYS",
    "RULES",
    "linear_scaling_warmup",
    "lr_factor",
    "scaled_lr",
    "sqrt_scaled_adam",
    "torch_warmup_decay",
]

RULES = ("linear", "sqrt")  # linear: SGD (Goyal et al. 2017); sqrt: Adam (Malladi et al. 2022)
DECAYS = ("step", "linear", "cosine")


def scaled_lr(base_lr: float, global_batch: int, base_batch: int, rule: str = "linear") -> float:
    """The learning rate for ``global_batch`` by the linear (SGD) or square-root (Adam) rule.

    Goyal et al. 2017, §2.1: lr = base_lr · k; Malladi et al. 2022 (Adam): lr = base_lr · √k,
    with k = global_batch / base_batch.

    Args:
        base_lr: learning rate tuned for ``base_batch``.
        global_batch: samples per optimizer step over all ranks (ranks × micro-batches ×
            micro-batch size).
        base_batch: the batch size ``base_lr`` was tuned for.
        rule: ``"linear"`` or ``"sqrt"``.

    Returns:
        The scaled learning rate.

    Raises:
        ValueError: a batch size is not positive, ``base_lr`` is negative or the rule unknown.
    """
    if global_batch <= 0 or base_batch <= 0 or base_lr < 0:
        raise ValueError(
            f"need batches > 0 and base_lr >= 0, got {global_batch=}, {base_batch=}, {base_lr=}"
        )
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    k = global_batch / base_batch
    return base_lr * (k if rule == "linear" else math.sqrt(k))


def sqrt_scaled_adam(
    base_lr: float,
    betas: tuple[float, float],
    eps: float,
    global_batch: int,
    base_batch: int,
) -> dict[str, float | tuple[float, float]]:
    """Adam's hyperparameters for ``global_batch`` by the square-root scaling rule.

    Malladi et al. 2022, the square-root scaling rule for Adam: with κ = global_batch /
    base_batch, lr × √κ, β₁ → 1 − κ(1 − β₁), β₂ → 1 − κ(1 − β₂), ε → ε / √κ.

    Args:
        base_lr: learning rate tuned for ``base_batch``.
        betas: (β₁, β₂) tuned for ``base_batch``.
        eps: Adam's ε tuned for ``base_batch``.
        global_batch: samples per optimizer step over all ranks.
        base_batch: the batch size the others were tuned for.

    Returns:
        ``{"lr", "betas", "eps"}``: keyword arguments for ``torch.optim.Adam``.

    Raises:
        ValueError: κ(1 − β) reaches 1 (the rule needs 1 − β small against 1/κ).
    """
    k = global_batch / base_batch
    new_betas = tuple(1.0 - k * (1.0 - b) for b in betas)
    if not all(0.0 <= b < 1.0 for b in new_betas):
        raise ValueError(f"κ = {k:g} is too large for betas {betas}: got {new_betas}")
    return {
        "lr": scaled_lr(base_lr, global_batch, base_batch, rule="sqrt"),
        "betas": (new_betas[0], new_betas[1]),
        "eps": eps / math.sqrt(k),
    }


def lr_factor(
    step: int,
    scale: float,
    warmup_steps: int,
    milestones: Sequence[int] = (),
    gamma: float = 0.1,
    decay: str = "step",
    total_steps: int | None = None,
    final_fraction: float = 0.0,
) -> float:
    """The multiplier of the base learning rate at optimizer step ``step`` (0-based).

    Goyal et al. 2017, §2.2 (gradual warmup); step decay at milestones as in their §5.1;
    cosine decay as SGDR (Loshchilov & Hutter 2017, eq. 5) without restarts.

    During warmup (step < warmup_steps) it rises linearly from 1 at step 0 towards ``scale``:
    1 + (scale − 1) · step / warmup_steps. From ``warmup_steps`` on, with
    u = (step − warmup_steps) / (total_steps − warmup_steps) clamped to [0, 1] and
    f = ``final_fraction``:

    - ``"step"``: ``scale`` times ``gamma`` for every milestone already reached;
    - ``"linear"``: scale · (f + (1 − f)(1 − u));
    - ``"cosine"``: scale · (f + (1 − f)(1 + cos πu) / 2).

    Args:
        step: optimizer steps taken so far.
        scale: global_batch / base_batch (k in the paper), or √k for the square-root rule.
        warmup_steps: steps of the warmup (0: none — the full ``scale`` from the start).
        milestones: for ``"step"``: steps at which the rate is multiplied by ``gamma``.
        gamma: for ``"step"``: decay factor at each milestone.
        decay: ``"step"``, ``"linear"`` or ``"cosine"``.
        total_steps: for ``"linear"`` and ``"cosine"``: the step at which the decay ends.
        final_fraction: for ``"linear"`` and ``"cosine"``: the rate at ``total_steps`` as a
            fraction of the peak.

    Returns:
        The factor: lr(step) = base_lr · factor.

    Raises:
        ValueError: a negative step, warmup or scale; an unknown decay; a smooth decay without
            ``total_steps`` > ``warmup_steps``; ``final_fraction`` outside [0, 1].
    """
    if step < 0 or warmup_steps < 0 or scale <= 0:
        raise ValueError(f"need step >= 0, warmup_steps >= 0, scale > 0: {step=}, {warmup_steps=}")
    if decay not in DECAYS:
        raise ValueError(f"decay must be one of {DECAYS}, got {decay!r}")
    if decay != "step" and (total_steps is None or total_steps <= warmup_steps):
        raise ValueError(f"decay {decay!r} needs total_steps > warmup_steps, got {total_steps}")
    if not 0.0 <= final_fraction <= 1.0:
        raise ValueError(f"final_fraction must be in [0, 1], got {final_fraction}")
    if step < warmup_steps:
        return 1.0 + (scale - 1.0) * step / warmup_steps
    if decay == "step":
        return scale * gamma ** sum(step >= m for m in milestones)
    assert total_steps is not None
    u = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    shape = 1.0 - u if decay == "linear" else (1.0 + math.cos(math.pi * u)) / 2
    return scale * (final_fraction + (1.0 - final_fraction) * shape)


def linear_scaling_warmup(
    optimizer: torch.optim.Optimizer,
    global_batch: int,
    base_batch: int,
    warmup_steps: int,
    milestones: Sequence[int] = (),
    gamma: float = 0.1,
    *,
    rule: str = "linear",
    decay: str = "step",
    total_steps: int | None = None,
    final_fraction: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler: the scaled rate reached by gradual warmup (Goyal et al. 2017), then decay.

    Build the optimizer with the learning rate tuned for ``base_batch``; after creating this
    scheduler, its rate is that base rate (step 0) and it reaches base · k (``rule="linear"``)
    or base · √k (``rule="sqrt"``), k = global_batch / base_batch, after ``warmup_steps`` calls
    of ``scheduler.step()`` (one per optimizer step); then ``decay`` as in ``lr_factor``.
    Each parameter group is scaled from its own base rate.

    Args:
        optimizer: the optimizer, built with the base learning rate.
        global_batch: samples per optimizer step over all ranks.
        base_batch: the batch size the base learning rate was tuned for.
        warmup_steps: optimizer steps of linear warmup (the paper: 5 epochs' worth).
        milestones: optimizer steps at which the rate is multiplied by ``gamma`` (step decay).
        gamma: decay factor at each milestone.
        rule: ``"linear"`` (SGD) or ``"sqrt"`` (Adam's learning rate, Malladi et al. 2022).
        decay: ``"step"``, ``"linear"`` or ``"cosine"`` after the warmup.
        total_steps: where a linear or cosine decay ends.
        final_fraction: the rate at ``total_steps`` as a fraction of the peak.

    Returns:
        ``torch.optim.lr_scheduler.LambdaLR`` with factor ``lr_factor(step, ...)``.

    Raises:
        ValueError: a batch size is not positive, ``warmup_steps`` is negative, or the decay's
            arguments do not fit (see ``lr_factor``).
    """
    scale = scaled_lr(1.0, global_batch, base_batch, rule)
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    milestones = tuple(milestones)
    lr_factor(0, scale, warmup_steps, milestones, gamma, decay, total_steps, final_fraction)

    def factor(step: int) -> float:
        return lr_factor(step, scale, warmup_steps, milestones, gamma, decay, total_steps,
                         final_fraction)  # fmt: skip

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def torch_warmup_decay(
    optimizer: torch.optim.Optimizer,
    scale: float,
    warmup_steps: int,
    total_steps: int,
    decay: str,
    final_fraction: float = 0.0,
) -> torch.optim.lr_scheduler.LRScheduler:
    """The same warmup and decay from PyTorch's own schedulers, to check ``lr_factor`` against.

    PyTorch's ``LinearLR`` factors lie in (0, 1], so here the optimizer is built with the
    *peak* rate (base · ``scale``): ``LinearLR(start_factor=1/scale)`` for the warmup, then
    ``CosineAnnealingLR(T_max=total − warmup, eta_min=final · peak)`` or
    ``LinearLR(1, final, total − warmup)``, joined by ``SequentialLR`` at ``warmup_steps``.

    Args:
        optimizer: the optimizer, built with the peak learning rate.
        scale: peak / base rate (≥ 1).
        warmup_steps: steps of linear warmup from base to peak (0: none).
        total_steps: the step at which the decay ends.
        decay: ``"linear"`` or ``"cosine"``.
        final_fraction: the rate at ``total_steps`` as a fraction of the peak.

    Returns:
        The scheduler (``SequentialLR``, or the decay alone without warmup).

    Raises:
        ValueError: ``scale`` < 1, an unknown decay, or ``total_steps`` <= ``warmup_steps``.
    """
    if scale < 1.0 or decay not in ("linear", "cosine") or total_steps <= warmup_steps:
        raise ValueError(
            f"need scale >= 1, decay linear or cosine, total_steps > warmup_steps: "
            f"{scale=}, {decay=}, {total_steps=}, {warmup_steps=}"
        )
    S = torch.optim.lr_scheduler
    n = total_steps - warmup_steps
    if decay == "cosine":
        eta_min = final_fraction * optimizer.param_groups[0]["lr"]
        tail: S.LRScheduler = S.CosineAnnealingLR(optimizer, T_max=n, eta_min=eta_min)
    else:
        tail = S.LinearLR(optimizer, start_factor=1.0, end_factor=final_fraction, total_iters=n)
    if warmup_steps == 0:
        return tail
    warm = S.LinearLR(optimizer, start_factor=1.0 / scale, end_factor=1.0, total_iters=warmup_steps)
    return S.SequentialLR(optimizer, [warm, tail], milestones=[warmup_steps])
