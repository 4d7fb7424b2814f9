"""Memory of one stage: parameters, gradients, optimizer states and activations, measured
by counting tensors and modelled (``lk.memory`` for model states, a layer rule for activations).

Introduced in notebooks/10_model_parallel.ipynb.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from labkit.memory import zero_memory

__all__ = ["StageMemory", "activation_bytes_model", "measure_stage_memory", "stage_memory_model"]


def activation_bytes_model(
    stage: nn.Sequential, batch_size: int, bytes_per_element: int = 4
) -> int:
    """Activation bytes a stage of Linear / ReLU / ComputeDelay layers keeps for its backward.

    The rule autograd follows: a ``Linear`` keeps its input, a ``ReLU`` its output, an
    identity (``ComputeDelay``) nothing new; the stage keeps its own input and output too.
    A tensor kept twice counts once.

    Args:
        stage: the stage's layers.
        batch_size: rows of the batch.
        bytes_per_element: 4 for float32.

    Returns:
        int: ``batch_size × bytes_per_element × Σ widths of the distinct kept tensors``.

    Raises:
        ValueError: a layer of another type, or a stage with no Linear to give the width.
    """
    from labkit.models import ComputeDelay

    layers = [m for m in stage.modules() if not list(m.children())]  # leaves, in order
    linears = [m for m in layers if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("the model needs a Linear layer to know the activations' width")
    width = linears[0].in_features
    kept, tensor = {0: width}, 0  # tensor id → width; the stage's input is tensor 0
    for layer in layers:
        if isinstance(layer, nn.Linear):
            kept[tensor] = layer.in_features
            tensor, width = tensor + 1, layer.out_features
        elif isinstance(layer, nn.ReLU):
            tensor += 1
            kept[tensor] = width
        elif not isinstance(layer, ComputeDelay):
            raise ValueError(f"no activation rule for {type(layer).__name__}")
    kept[tensor] = width  # the output, kept to call backward on it
    return batch_size * bytes_per_element * sum(kept.values())


@dataclass(frozen=True)
class StageMemory:
    """Bytes one stage holds: parameters, gradients, optimizer states, activations."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activation_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activation_bytes


def _nbytes(tensors: Iterable[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def measure_stage_memory(
    stage: nn.Module, optimizer: torch.optim.Optimizer | None, activation_bytes: int
) -> StageMemory:
    """Count the bytes of the tensors a stage holds after a step.

    Args:
        stage: the stage (its parameters and their ``.grad``).
        optimizer: its optimizer; every tensor in its state counts (Adam: ``exp_avg``,
            ``exp_avg_sq`` and a 4-byte ``step`` per parameter tensor).
        activation_bytes: measured by ``ModelSplit.forward`` (``StepResult.activation_bytes``).

    Returns:
        StageMemory: measured bytes.
    """
    params = list(stage.parameters())
    states = [optimizer.state[p] for p in params if optimizer and p in optimizer.state]
    return StageMemory(
        params_bytes=_nbytes(params),
        grads_bytes=_nbytes(p.grad for p in params),
        optimizer_bytes=_nbytes(v for s in states for v in s.values()),
        activation_bytes=activation_bytes,
    )


def stage_memory_model(
    stage: nn.Sequential, batch_size: int, *, bytes_per_element: int = 4, optimizer_bytes: int = 8
) -> StageMemory:
    """The memory model of a stage: ``lk.memory`` for model states, a layer rule for activations.

    Model states are ZeRO's stage-0 arithmetic on one device (Rajbhandari et al. 2020, §5)
    with fp32 parameters and gradients and K = ``optimizer_bytes`` (8: Adam's two fp32
    moments); activations are ``activation_bytes_model``.

    Args:
        stage: the stage's layers.
        batch_size: rows of the batch.
        bytes_per_element: 4 for float32 parameters, gradients and activations.
        optimizer_bytes: optimizer bytes per parameter.

    Returns:
        StageMemory: modelled bytes.
    """
    n = sum(p.numel() for p in stage.parameters())
    activations = activation_bytes_model(stage, batch_size, bytes_per_element)
    if n == 0:
        return StageMemory(0.0, 0.0, 0.0, activations)
    states = zero_memory(
        n, 1, 0, param_bytes=bytes_per_element, grad_bytes=bytes_per_element,
        optimizer_bytes=optimizer_bytes,
    )  # fmt: skip
    return StageMemory(states.params_bytes, states.grads_bytes, states.optimizer_bytes, activations)
