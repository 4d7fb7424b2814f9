"""Datasets that need no download: scikit-learn's digits, synthetic data, a character corpus.

Introduced in notebooks/06_data_parallel.ipynb (digits), notebooks/08_sync_vs_async.ipynb
(synthetic regression) and notebooks/21_capstone.ipynb (the character corpus).

scikit-learn ships the UCI optical-recognition digits (1,797 images of 8×8 pixels, 16 grey
levels, 10 classes) inside the package, so the course trains on real data offline. Synthetic
regression data comes with its true weights, for lessons that need a known answer. The
character corpus is real English text read from files installed with scikit-learn: the
descriptions of its datasets (``sklearn/datasets/descr/*.rst``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = [
    "CharCorpus",
    "char_corpus",
    "corpus_files",
    "digits",
    "shard_loader",
    "synthetic_regression",
]


def digits(
    split: str = "train", test_fraction: float = 0.2, images: bool = False, seed: int = 0
) -> TensorDataset:
    """scikit-learn's 8×8 handwritten digits as a ``TensorDataset`` of (x, label).

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


def corpus_files() -> list[Path]:
    """The text files ``char_corpus`` reads: scikit-learn's dataset descriptions, sorted by name.

    Returns:
        Paths of ``sklearn/datasets/descr/*.rst`` in the installed scikit-learn.

    Raises:
        FileNotFoundError: the installed scikit-learn ships no such files.
    """
    import sklearn

    files = sorted((Path(sklearn.__file__).parent / "datasets" / "descr").glob("*.rst"))
    if not files:
        raise FileNotFoundError("no sklearn/datasets/descr/*.rst in the installed scikit-learn")
    return files


@dataclass(frozen=True)
class CharCorpus:
    """A text as character ids, split into a training head and a validation tail.

    The vocabulary is every distinct character of the text in sorted order (nanoGPT's
    ``shakespeare_char`` preparation): id ``i`` is ``chars[i]``.

    Attributes:
        text: the whole text.
        chars: the vocabulary, sorted.
        train: ids of the first ``1 - val_fraction`` of the text (int64).
        val: ids of the rest.
        sources: names of the files the text came from.
    """

    text: str
    chars: str
    train: torch.Tensor
    val: torch.Tensor
    sources: tuple[str, ...]

    @property
    def vocab_size(self) -> int:
        """Number of distinct characters."""
        return len(self.chars)

    def encode(self, s: str) -> torch.Tensor:
        """Ids of the characters of ``s`` (int64); a character outside the vocabulary raises."""
        index = {c: i for i, c in enumerate(self.chars)}
        missing = sorted(set(s) - index.keys())
        if missing:
            raise ValueError(f"characters not in the vocabulary: {missing}")
        return torch.tensor([index[c] for c in s], dtype=torch.int64)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """The text of a sequence of ids."""
        return "".join(self.chars[int(i)] for i in ids)

    def batch(
        self,
        batch_size: int,
        seq_len: int,
        split: str = "train",
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows of the text: inputs and the next character at each position.

        Args:
            batch_size: B windows.
            seq_len: T characters each.
            split: ``"train"`` or ``"val"``.
            generator: picks the windows' starts (pass a seeded one: same batch everywhere).

        Returns:
            ``(x, y)``, both (B, T) int64, ``y[:, t] = x[:, t + 1]`` within the text.

        Raises:
            ValueError: an unknown split, or a window longer than the split.
        """
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        ids = self.train if split == "train" else self.val
        if not 1 <= seq_len < len(ids) or batch_size < 1:
            raise ValueError(
                f"need batch_size >= 1 and 1 <= seq_len < {len(ids)} ({split} characters), "
                f"got {batch_size}, {seq_len}"
            )
        starts = torch.randint(0, len(ids) - seq_len, (batch_size,), generator=generator)
        window = starts[:, None] + torch.arange(seq_len + 1)  # (B, T + 1)
        chunk = ids[window]
        return chunk[:, :-1], chunk[:, 1:]


def char_corpus(
    val_fraction: float = 0.1, files: list[Path] | list[str] | None = None
) -> CharCorpus:
    """Real English text from files on disk, as a character-level corpus: no download.

    Args:
        val_fraction: share of the text, at its end, kept for validation.
        files: text files to read (default ``corpus_files()``: scikit-learn's dataset
            descriptions, about 43,000 characters).

    Returns:
        The ``CharCorpus``; its files joined by a blank line, in the order given.

    Raises:
        ValueError: a fraction outside (0, 1), or no text.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    paths = [Path(f) for f in (corpus_files() if files is None else files)]
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in paths)
    if len(text) < 2:
        raise ValueError(f"the corpus needs at least 2 characters, got {len(text)}")
    chars = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.int64)
    n_train = len(ids) - max(1, round(len(ids) * val_fraction))
    return CharCorpus(text, chars, ids[:n_train], ids[n_train:], tuple(p.name for p in paths))
