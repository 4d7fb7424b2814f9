"""Datasets that need no download: scikit-learn's handwritten digits and synthetic data.

Introduced in notebooks/06_data_parallel.ipynb.

scikit-learn ships the UCI optical-recognition digits (1,797 images of 8×8 pixels, 16 grey
levels, 10 classes) inside the package, so the course trains on real data offline. Synthetic
regression data comes with its true weights, for lessons that need a known answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = ["digits", "shard_loader", "synthetic_regression"]


def digits(
    split: str = "train", test_fraction: float = 0.2, images: bool = False, seed: int = 0
) -> TensorDataset:
    """scikit-learn's 8×8 handwritten digits as a ``TensorDataset`` of (x, label).

    Introduced in notebooks/06_data_parallel.ipynb.

    Pixels are scaled from 0..16 to 0..1 (float32); labels are int64. The train/test split is a
    fixed permutation from ``seed``, the same on every rank and every run.

    Args:
        split: ``"train"``, ``"test"`` or ``"all"``.
        test_fraction: share of the 1,797 images held out for ``"test"``.
        images: ``True`` for x of shape (N, 1, 8, 8); ``False`` for (N, 64).
        seed: the permutation seed.

    Returns:
        The dataset.

    Raises:
        ValueError: for an unknown split or a fraction outside (0, 1).
    """
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn.datasets import load_digits  # shipped with scikit-learn: no download

    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0  # (1797, 64)
    y = torch.tensor(bunch.target, dtype=torch.int64)  # (1797,)
    if images:
        x = x.view(-1, 1, 8, 8)
    if split == "all":
        return TensorDataset(x, y)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = round(len(y) * test_fraction)
    idx = order[:n_test] if split == "test" else order[n_test:]
    return TensorDataset(x[idx], y[idx])


def synthetic_regression(
    n_samples: int = 1024,
    in_features: int = 16,
    out_features: int = 1,
    noise: float = 0.01,
    seed: int = 0,
) -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    """Linear-regression data y = x·Wᵀ + b + noise, with the true W and b.

    Introduced in notebooks/08_sync_vs_async.ipynb.

    Args:
        n_samples: number of rows.
        in_features: width of x.
        out_features: width of y.
        noise: standard deviation of the Gaussian noise added to y.
        seed: generator seed (same data on every rank).

    Returns:
        ``(dataset, W, b)`` with W of shape (out_features, in_features) and b (out_features,).

    Raises:
        ValueError: for non-positive sizes or negative noise.
    """
    if min(n_samples, in_features, out_features) <= 0 or noise < 0:
        raise ValueError(
            "n_samples, in_features, out_features must be > 0 and noise >= 0, got "
            f"{n_samples}, {in_features}, {out_features}, {noise}"
        )
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=g)
    b = torch.randn(out_features, generator=g)
    x = torch.randn(n_samples, in_features, generator=g)
    y = x @ w.T + b + noise * torch.randn(n_samples, out_features, generator=g)
    return TensorDataset(x, y), w, b


def shard_loader(
    dataset: Dataset,
    batch_size: int,
    group: dist.ProcessGroup | None = None,
    drop_last: bool = False,
    seed: int = 0,
    shuffle: bool = True,
) -> DataLoader:
    """A DataLoader over this rank's shard of ``dataset`` (a ``DistributedSampler``).

    Introduced in notebooks/06_data_parallel.ipynb.

    The sampler gives rank r of p the indices r, r+p, r+2p, … of a (seeded) permutation. When
    p does not divide the dataset size it pads by repeating the first indices
    (``drop_last=False``) or drops the tail (``drop_last=True``), so every rank gets the same
    number of samples and takes the same number of steps. Call
    ``loader.sampler.set_epoch(epoch)`` each epoch for a new shuffle.

    Args:
        dataset: the full dataset (the same on every rank).
        batch_size: samples per rank per step (the global batch is ``batch_size`` · p).
        group: the data-parallel process group (None: the default group).
        drop_last: passed to the ``DistributedSampler`` (drop the tail instead of padding).
        seed: the shuffle seed (must be the same on every rank).
        shuffle: shuffle the indices (each epoch, after ``set_epoch``).

    Returns:
        The DataLoader; ``.sampler`` is the ``DistributedSampler``.

    Raises:
        ValueError: if the process group is not initialised.
    """
    import torch.distributed as dist  # noqa: F811 - at run time, not only for the hint
    from torch.utils.data.distributed import DistributedSampler

    if not dist.is_initialized():
        raise ValueError("shard_loader needs an initialised process group (run it in a rank)")
    sampler = DistributedSampler(
        dataset,
        num_replicas=dist.get_world_size(group),
        rank=dist.get_rank(group),
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)
