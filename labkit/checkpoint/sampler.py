"""A sampler that can resume in the middle of an epoch, deterministically.

Introduced in notebooks/19_fault_tolerance.ipynb.

``DistributedSampler`` shuffles with ``seed + epoch``, so an epoch's order is a pure
function of the epoch number: to resume after ``k`` batches of epoch ``e`` it is enough to
regenerate epoch ``e``'s order and skip its first ``k * batch_size`` indices (the approach
of torchdata's ``StatefulDataLoader`` and torchtitan's resumable data loader).
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any


class ResumableSampler:
    """Wrap a sampler whose order depends only on its epoch; skip batches already trained on.

    The training loop calls ``advance()`` after each batch it has fully trained on (or sets
    ``batches_done``), ``set_epoch(e)`` at the start of each epoch, and saves
    ``state_dict()`` = ``{"epoch": e, "batches_done": k}`` in its checkpoint. After
    ``load_state_dict`` the next iteration yields epoch ``e``'s indices from batch ``k`` on.

    Args:
        sampler: e.g. ``DistributedSampler(ds, num_replicas, rank, shuffle=True, seed=s)``;
            must have ``set_epoch`` if it shuffles.
        batch_size: indices per batch (the DataLoader's ``batch_size``).
    """

    def __init__(self, sampler: Any, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.epoch = 0
        self.batches_done = 0

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first batch (unless it is the resumed epoch)."""
        if epoch != self.epoch:
            self.batches_done = 0
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def advance(self, n_batches: int = 1) -> None:
        """Record that ``n_batches`` more batches of this epoch have been trained on."""
        self.batches_done += n_batches

    def __iter__(self) -> Iterator[int]:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        skip = self.batches_done * self.batch_size
        for i, index in enumerate(self.sampler):
            if i >= skip:
                yield index

    def __len__(self) -> int:
        n = len(self.sampler) if isinstance(self.sampler, Sized) else 0
        return max(0, n - self.batches_done * self.batch_size)

    def state_dict(self) -> dict[str, int]:
        """The position to resume from: ``{"epoch": e, "batches_done": k}``."""
        return {"epoch": self.epoch, "batches_done": self.batches_done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at ``state["epoch"]``, after its first ``state["batches_done"]`` batches."""
        self.epoch = int(state["epoch"])
        self.batches_done = int(state["batches_done"])
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
