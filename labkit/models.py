"""Small models for the labs: an MLP and a CNN for the 8×8 digits, and a size-dialled MLP.

Introduced in notebooks/06_data_parallel.ipynb. Models live here, never inside
``labkit/parallel/`` (a parallelism wraps any model; STYLE.md "model-agnostic vs model-specific").

Every constructor takes a ``seed`` and builds the same parameters on every process for the same
seed, so single-process references and ranks start from identical weights without a broadcast.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["CNN", "MLP", "count_parameters", "mlp_with_parameters"]


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """Seed torch's RNG with ``seed`` inside the block and restore the global state after it."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class MLP(nn.Module):
    """A multilayer perceptron: Linear → ReLU → … → Linear.

    Introduced in notebooks/06_data_parallel.ipynb.

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

    Introduced in notebooks/06_data_parallel.ipynb.

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


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters in ``model``.

    Introduced in notebooks/06_data_parallel.ipynb.

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

    Introduced in notebooks/07_ddp_buckets_and_overlap.ipynb (benchmarks need a model of a
    chosen size, e.g. ≥ 5 M parameters for DDP step times).

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
