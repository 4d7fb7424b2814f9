"""Launch capstone runs from a notebook: one strategy, or several in one launch.

Introduced in notebooks/17_capstone.ipynb.

The ranks follow the device rule (``labkit.launcher.device_rule``): ``cuda:<rank>`` with NCCL
when every rank has a GPU, the CPU with gloo otherwise. Every piece the capstone composes
keeps its tensors on the rank's device (``lk.get_device()``).
"""

from __future__ import annotations

from typing import Any

from labkit.capstone.config import RunConfig
from labkit.capstone.strategy import Strategy
from labkit.capstone.train import train_rank
from labkit.launcher import launch

__all__ = ["run", "run_many", "train_many"]


def run(
    strategy: Strategy,
    config: RunConfig,
    backend: Any = "auto",
    timeout: float = 120.0,
    device: str = "auto",
) -> list[dict]:
    """Launch ``train_rank`` on ``strategy.world_size`` ranks; every rank's result, in order.

    Args:
        strategy: how to split the model.
        config: the run.
        backend: process-group backend (``"auto"``: the device rule's), a labkit backend or
            an ``lk.BackendSpec``.
        timeout: seconds before the launch is stopped.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.

    Returns:
        ``train_rank``'s dicts, one per rank.

    Raises:
        ValueError: the config cannot be split by the strategy (checked before launching).
    """
    config.check(strategy)
    return launch(
        train_rank, strategy.world_size, backend, args=(strategy, config), timeout=timeout,
        device=device,
    )  # fmt: skip


def train_many(rank: int, world_size: int, strategies: list[Strategy], config: RunConfig) -> dict:
    """``train_rank`` for each strategy in turn, in one launch (one process start-up for all).

    Returns:
        ``{strategy.key: train_rank's dict}``.
    """
    return {s.key: train_rank(rank, world_size, s, config) for s in strategies}


def run_many(
    strategies: list[Strategy],
    config: RunConfig,
    backend: Any = "auto",
    timeout: float = 300.0,
    device: str = "auto",
) -> dict[str, list[dict]]:
    """Train every strategy (all on the same world size) in one launch.

    Args:
        strategies: strategies with one ``world_size`` and distinct ``key``\\ s.
        config: the run.
        backend: process-group backend.
        timeout: seconds for all of them together.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.

    Returns:
        ``{strategy.key: [rank 0's dict, rank 1's, ...]}`` in the order given.

    Raises:
        ValueError: no strategies, different world sizes, two with one key, or a config a
            strategy cannot split.
    """
    sizes = {s.world_size for s in strategies}
    if len(sizes) != 1:
        raise ValueError(f"run_many needs strategies of one world size, got {sorted(sizes)}")
    keys = [s.key for s in strategies]
    if len(set(keys)) != len(keys):
        raise ValueError(f"run_many needs distinct strategies, got {keys}")
    for s in strategies:
        config.check(s)
    per_rank = launch(
        train_many, sizes.pop(), backend, args=(strategies, config), timeout=timeout,
        device=device,
    )  # fmt: skip
    return {s.key: [r[s.key] for r in per_rank] for s in strategies}
