"""An MLP and a CNN for the 8×8 digits, a size-dialled MLP and an emulated-compute layer.

Introduced in notebooks/06_data_parallel.ipynb (the digits models) and
notebooks/07_ddp_buckets_and_overlap.ipynb (``mlp_with_parameters``, ``ComputeDelay``).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from labkit.models._seed import seeded as _seeded

__all__ = ["CNN", "MLP", "ComputeDelay", "count_parameters", "mlp_with_parameters"]


class MLP(nn.Module):
    """A multilayer perceptron: Linear → ReLU → … → Linear.

    Args:
        in_features: input width (64 for 8×8 digits flattened).
        hidden: widths of the hidden layers, in order.
        out_features: output width (10 digit classes).
        seed: when given, parameters are initialised from this seed without disturbing the
            global RNG, so every rank builds identical weights.
    """

    def __init__(
        self,
        in_features: int = 64,
        hidden: tuple[int, ...] | list[int] = (128, 64),
        out_features: int = 10,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        widths = [in_features, *hidden, out_features]
        layers: list[nn.Module] = []
        with _seeded(seed):
            for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
                layers.append(nn.Linear(a, b))
                if i < len(widths) - 2:
                    layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))  # (B, in_features) → (B, out_features)


class CNN(nn.Module):
    """A small convolutional network for 1×8×8 digit images.

    conv(1→c1, 3×3) → ReLU → conv(c1→c2, 3×3) → ReLU → 2×2 max-pool → Linear(c2·4·4 → 10).

    Args:
        channels: the two convolution widths (c1, c2).
        out_features: number of classes.
        seed: when given, parameters are initialised from this seed (see ``MLP``).
    """

    def __init__(
        self, channels: tuple[int, int] = (8, 16), out_features: int = 10, seed: int | None = 0
    ) -> None:
        super().__init__()
        c1, c2 = channels
        with _seeded(seed):
            self.features = nn.Sequential(
                nn.Conv2d(1, c1, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(c1, c2, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
            )
            self.head = nn.Linear(c2 * 4 * 4, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # flattened digits (B, 64) → images (B, 1, 8, 8)
            x = x.view(-1, 1, 8, 8)
        return self.head(self.features(x).flatten(1))


class _Delay(torch.autograd.Function):
    """Identity whose forward and backward each sleep a fixed time (no CPU used)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
        ctx.backward_s = backward_s
        time.sleep(forward_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        time.sleep(ctx.backward_s)
        return grad, None, None


class ComputeDelay(nn.Module):
    """An identity layer that takes a fixed time in forward and in backward: emulated compute.

    On an accelerator a layer's kernels take a predictable time while the CPU stays free; four ranks
    sharing two CPU cores cannot show that (they slow each other down). Sleeping instead of
    computing gives each rank the timing of a fast device without using a core, so overlap of
    communication with backward can be measured on a laptop.

    Args:
        forward_ms: sleep in forward, milliseconds (≥ 0).
        backward_ms: sleep in backward, milliseconds (≥ 0), just before the gradients of
            the layers in front of it are computed.

    Raises:
        ValueError: a negative time.
    """

    def __init__(self, forward_ms: float = 0.0, backward_ms: float = 0.0) -> None:
        super().__init__()
        if forward_ms < 0 or backward_ms < 0:
            raise ValueError(f"delays must be >= 0 ms, got {forward_ms}, {backward_ms}")
        self.forward_ms, self.backward_ms = forward_ms, backward_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Delay.apply(x, self.forward_ms / 1e3, self.backward_ms / 1e3)

    def extra_repr(self) -> str:
        return f"forward_ms={self.forward_ms:g}, backward_ms={self.backward_ms:g}"


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters in ``model``.

    Args:
        model: any module.

    Returns:
        The total ``numel`` of its parameters.
    """
    return sum(p.numel() for p in model.parameters())


def mlp_with_parameters(
    n_params: int, n_layers: int = 4, in_features: int = 64, out_features: int = 10, seed: int = 0
) -> MLP:
    """An MLP with ``n_layers`` equal hidden layers and at least ``n_params`` parameters.

    Benchmarks need a model of a chosen size, e.g. ≥ 5 M parameters for DDP step times.

    Args:
        n_params: the minimum parameter count wanted.
        n_layers: number of hidden layers (≥ 1).
        in_features: input width.
        out_features: output width.
        seed: initialisation seed.

    Returns:
        The smallest such MLP whose hidden width is a multiple of 64.

    Raises:
        ValueError: if ``n_params`` or ``n_layers`` is not positive.
    """
    if n_params <= 0 or n_layers < 1:
        raise ValueError(f"need n_params > 0 and n_layers >= 1, got {n_params}, {n_layers}")

    def size(h: int) -> int:
        return (in_features + 1) * h + (n_layers - 1) * (h + 1) * h + (h + 1) * out_features

    h = 64
    while size(h) < n_params:
        h += 64
    return MLP(in_features, (h,) * n_layers, out_features, seed=seed)
