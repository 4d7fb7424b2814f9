"""Seeded construction: the same parameters on every process, the global RNG left alone.

Introduced in notebooks/06_data_parallel.ipynb.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Seed torch's RNG with ``seed`` inside the block and restore the global state after it."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
