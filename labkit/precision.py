"""Mixed-precision training steps: bf16 autocast, and fp16 with loss scaling, on CPU or GPU.

Introduced in notebooks/09_accumulation_and_precision.ipynb.

Micikevicius et al. 2018, "Mixed Precision Training": keep fp32 master weights, run the
forward and backward matmuls in 16 bits, and — for fp16, whose smallest normal number is
6.1e-5 and whose largest is 65504 — multiply the loss by a scale S before backward so small
gradients do not flush to zero, divide the gradients by S before the update, and skip steps
whose gradients overflowed (§3.2). ``torch.amp.GradScaler`` does that with a dynamic S.
bfloat16 keeps fp32's 8-bit exponent (range ~1e-38 … 3e38) with a 7-bit mantissa, so it needs
no loss scaling.

Both run on a CPU in the pinned torch 2.13: ``torch.autocast("cpu", dtype=torch.float16)`` runs
the linear, convolution, matmul and attention ops of ``lk.models`` (MLP, CNN, TinyGPT) in fp16,
and ``torch.amp.GradScaler("cpu")`` scales the loss, skips the steps whose gradients overflowed
and updates its scale by the rule ``next_loss_scale`` writes out (tests/test_precision.py checks
all three on the CPU). Speed is another matter — a CPU without fp16 matrix units gains nothing —
but fp16's range, its underflow and loss scaling are the same arithmetic as on a GPU.

Precisions are named ``"fp32"`` (no autocast), ``"bf16"`` and ``"fp16"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

__all__ = [
    "DTYPES",
    "autocast",
    "evaluate",
    "make_scaler",
    "mixed_precision_step",
    "next_loss_scale",
    "train_classifier",
    "unsupported_reason",
]

DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def unsupported_reason(precision: str, device: torch.device | str) -> str | None:
    """Why ``precision`` cannot train on ``device`` here, or None when it can.

    Args:
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        device: where the model lives (``"cpu"``, ``"cuda"``, ``"cuda:1"`` ...).

    Returns:
        A sentence to print, or None.

    Raises:
        ValueError: an unknown precision.
    """
    if precision not in DTYPES:
        raise ValueError(f"precision must be one of {sorted(DTYPES)}, got {precision!r}")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        return f"{device} requested but torch.cuda.is_available() is False"
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return f"this GPU ({torch.cuda.get_device_name(device)}) has no bf16 support"
    return None


def _check(precision: str, device: torch.device | str) -> None:
    reason = unsupported_reason(precision, device)
    if reason is not None:
        raise RuntimeError(reason)


def autocast(precision: str, device: torch.device | str) -> torch.autocast:
    """The ``torch.autocast`` context for ``precision`` on ``device`` (disabled for fp32).

    Args:
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        device: the model's device.

    Returns:
        ``torch.autocast(device_type, dtype=..., enabled=precision != "fp32")``.

    Raises:
        RuntimeError: the precision cannot run on this device (see ``unsupported_reason``).
    """
    _check(precision, device)
    dtype = DTYPES[precision]
    device_type = torch.device(device).type
    return torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def make_scaler(
    precision: str, device: torch.device | str, **kwargs: Any
) -> torch.amp.GradScaler | None:
    """A ``torch.amp.GradScaler`` for fp16 on the model's device type; None for fp32 and bf16.

    Args:
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        device: the model's device: ``GradScaler("cpu")`` or ``GradScaler("cuda")``.
        **kwargs: passed to ``GradScaler`` (``init_scale``, ``growth_interval`` ...).

    Returns:
        The scaler, or None (bf16 keeps fp32's range: no loss scaling needed).

    Raises:
        RuntimeError: the precision cannot run on this device (see ``unsupported_reason``).
    """
    _check(precision, device)
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(torch.device(device).type, **kwargs)


def next_loss_scale(
    scale: float,
    clean_steps: int,
    found_inf: bool,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> tuple[float, int]:
    """The dynamic loss-scale rule, written out: the scale and clean-step count after a step.

    Micikevicius et al. 2018, §3.2 (dynamic loss scaling), with the defaults and the update of
    ``torch.amp.GradScaler.update`` (``torch._amp_update_scale_``): an inf/NaN gradient
    multiplies the scale by ``backoff_factor`` (the step is skipped) and restarts the count;
    ``growth_interval`` clean steps in a row multiply it by ``growth_factor``.

    Args:
        scale: the scale S the step's loss was multiplied by.
        clean_steps: clean (finite-gradient) steps in a row before this one.
        found_inf: whether this step's gradients held an inf or NaN.
        growth_factor: factor after ``growth_interval`` clean steps.
        backoff_factor: factor after an overflow.
        growth_interval: clean steps in a row before the scale grows.

    Returns:
        ``(scale, clean_steps)`` for the next step.
    """
    if found_inf:
        return scale * backoff_factor, 0
    if clean_steps + 1 == growth_interval:
        return scale * growth_factor, 0
    return scale, clean_steps + 1


def mixed_precision_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    precision: str = "bf16",
    scaler: torch.amp.GradScaler | None = None,
    max_norm: float | None = None,
) -> float:
    """One training step with the forward under autocast and, for fp16, loss scaling.

    Micikevicius et al. 2018, §3: fp32 master weights, 16-bit forward/backward, loss scaling.

    The forward runs under ``autocast(precision, x.device)``; the loss is computed in fp32 from
    the upcast output. With a scaler: ``scaler.scale(loss).backward()``, ``unscale_`` before
    clipping (so ``max_norm`` applies to the true gradients), ``scaler.step`` (skipped when a
    gradient is inf/NaN) and ``scaler.update``. Without: backward, clip, step.

    Args:
        model: the model (its parameters stay fp32).
        optimizer: its optimizer.
        x: inputs on the model's device.
        y: targets.
        loss_fn: ``loss_fn(output, target)`` → scalar loss.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        scaler: required for fp16 (``make_scaler``); must be None otherwise.
        max_norm: clip the gradient 2-norm to this (None: no clipping).

    Returns:
        The loss (float, before the step).

    Raises:
        RuntimeError: the precision cannot run on this device.
        ValueError: fp16 without a scaler, or a scaler with another precision.
    """
    if (precision == "fp16") != (scaler is not None):
        raise ValueError("fp16 needs a GradScaler (make_scaler) and the other precisions none")
    optimizer.zero_grad(set_to_none=True)
    with autocast(precision, x.device):
        out = model(x)
    loss = loss_fn(out.float(), y)
    if scaler is None:
        loss.backward()
        if max_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        if max_norm is not None:
            scaler.unscale_(optimizer)  # clip the true gradients, not S times them
            nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
    return loss.item()


@torch.no_grad()
def evaluate(model: nn.Module, data: TensorDataset, precision: str = "fp32") -> float:
    """Classification accuracy of ``model`` on ``data``, forward under ``precision``.

    Args:
        model: a classifier returning logits (B, classes).
        data: ``TensorDataset(x, labels)``.
        precision: the autocast precision of the forward.

    Returns:
        The share of correct predictions, in [0, 1].
    """
    device = next(model.parameters()).device
    x, y = (t.to(device) for t in data.tensors)
    with autocast(precision, device):
        pred = model(x).argmax(1)
    return (pred == y).float().mean().item()


def train_classifier(
    model: nn.Module,
    train: TensorDataset,
    test: TensorDataset,
    precision: str = "fp32",
    epochs: int = 5,
    batch_size: int = 64,
    lr: float = 0.1,
    seed: int = 0,
) -> dict[str, Any]:
    """Train with SGD (momentum 0.9) in ``precision``; the same data order for every precision.

    Args:
        model: a classifier, already on its device (e.g. ``lk.models.MLP(seed=0)``).
        train: training set ``TensorDataset(x, labels)``.
        test: held-out set.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (a GradScaler is made for fp16).
        epochs: passes over ``train``.
        batch_size: samples per step.
        lr: learning rate.
        seed: seed of the shuffling (one permutation per epoch).

    Returns:
        dict: ``accuracy`` (test, in ``precision``), ``losses`` (per step), ``precision``,
        ``scale`` (the GradScaler's final scale, or None).

    Raises:
        RuntimeError: the precision cannot run on the model's device.
    """
    device = next(model.parameters()).device
    scaler = make_scaler(precision, device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x_all, y_all = (t.to(device) for t in train.tensors)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y_all), generator=gen).to(device)
        for idx in order.split(batch_size):
            losses.append(
                mixed_precision_step(model, opt, x_all[idx], y_all[idx], loss_fn, precision, scaler)
            )
    model.eval()
    return {
        "accuracy": evaluate(model, test, precision),
        "losses": losses,
        "precision": precision,
        "scale": scaler.get_scale() if scaler is not None else None,
    }
