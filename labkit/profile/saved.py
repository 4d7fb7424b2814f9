"""What autograd keeps for backward: the saved tensors of a forward, counted once each.

Introduced in notebooks/15_sequence_parallel.ipynb.

Every tensor an operation saves for its backward passes through the ``pack`` hook of
``torch.autograd.graph.saved_tensors_hooks``; :func:`saved_tensors` records them while a forward
runs. A tensor is counted by the storage it keeps alive (a view saves its whole base; q, k and v
reading one LayerNorm output keep it once), parameters are left out (they are kept anyway), and
so are 0-d scalars (bookkeeping such as a loss's normaliser or a kernel's random seed). A DTensor
is counted by its local shard. Activation checkpointing and offloading are hooks of the same
kind: a region that installs its own hooks hides its tensors from these.

    with lk.profile.saved_tensors(exclude=model.parameters()) as saved:
        y = model(x)
    saved.total_bytes          # what this rank holds between forward and backward
    saved.by_op()              # {"NativeLayerNormBackward0": ..., ...}
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SavedTensor", "SavedTensors", "saved_tensors"]


@dataclass(frozen=True)
class SavedTensor:
    """One storage kept for backward: its bytes and the first tensor seen on it."""

    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    op: str  # the node that produced the tensor ("" for a leaf, e.g. an input)


@dataclass
class SavedTensors:
    """The distinct storages saved inside a :func:`saved_tensors` block, by storage address."""

    kept: dict[int, SavedTensor] = field(default_factory=dict)
    excluded: set[int] = field(default_factory=set)

    @property
    def total_bytes(self) -> int:
        """Bytes of every distinct saved storage."""
        return sum(t.nbytes for t in self.kept.values())

    def by_op(self) -> dict[str, int]:
        """Bytes per producing operation (``grad_fn`` name), to read what the total is made of."""
        out: dict[str, int] = {}
        for t in self.kept.values():
            out[t.op] = out.get(t.op, 0) + t.nbytes
        return out

    def pack(self, t: Any) -> Any:
        """The pack hook: record ``t`` (once per storage), return it unchanged."""
        local = t.to_local() if hasattr(t, "to_local") and hasattr(t, "placements") else t
        if local.dim() == 0:
            return t
        storage = local.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.excluded or ptr in self.kept:
            return t
        op = type(t.grad_fn).__name__ if t.grad_fn is not None else ""
        dtype = str(local.dtype).removeprefix("torch.")
        self.kept[ptr] = SavedTensor(storage.nbytes(), tuple(local.shape), dtype, op)
        return t


@contextmanager
def saved_tensors(exclude: Iterable[Any] = ()) -> Iterator[SavedTensors]:
    """Record what autograd saves for backward while the block runs (forward passes only).

    Args:
        exclude: tensors not to count (a model's ``parameters()``: kept anyway); DTensors
            are excluded by their local shard.

    Returns:
        A context manager yielding the ``SavedTensors`` that fills up inside the block.
    """
    import torch

    record = SavedTensors()
    for t in exclude:
        local = t.to_local() if hasattr(t, "to_local") and hasattr(t, "placements") else t
        record.excluded.add(local.untyped_storage().data_ptr())
    with torch.autograd.graph.saved_tensors_hooks(record.pack, lambda t: t):
        yield record
