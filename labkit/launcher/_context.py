"""Per-rank facts that the launcher resolved, readable from code running inside a rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    device: Any  # torch.device, typed loosely so this module imports without torch
    backend: str


_current: RankContext | None = None


def set_rank_context(rank: int, world_size: int, device: Any, backend: str) -> None:
    global _current
    _current = RankContext(rank, world_size, device, backend)


def rank_context() -> RankContext:
    """The context of the rank this code runs in.

    Raises:
        RuntimeError: outside a rank started by ``lk.launch``.
    """
    if _current is None:
        raise RuntimeError(
            "not inside a rank: call this from a function run by lk.launch(fn, world_size=...)"
        )
    return _current


def get_device():
    """The ``torch.device`` that ``lk.launch`` resolved for this rank (``cuda:<rank>`` or cpu).

    Introduced in notebooks/00_setup_and_launcher.ipynb.

    Returns:
        torch.device: where this rank should put its tensors.

    Raises:
        RuntimeError: when called outside a rank started by ``lk.launch``.
    """
    return rank_context().device
