"""Launch capstone runs from a notebook: one strategy, or several in one launch.

Introduced in notebooks/21_capstone.ipynb.

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

__all__ = ["run", "run_jobs", "run_many", "train_many"]


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


def train_many(rank: int, world_size: int, jobs: list[tuple[Strategy, RunConfig]]) -> list[dict]:
    """``train_rank`` for each (strategy, config) in turn, in one launch (one start-up for all).

    Returns:
        ``train_rank``'s dict of each job, in order.
    """
    return [train_rank(rank, world_size, s, c) for s, c in jobs]


def run_jobs(
    jobs: list[tuple[Strategy, RunConfig]],
    backend: Any = "auto",
    timeout: float = 300.0,
    device: str = "auto",
) -> list[list[dict]]:
    """Run several (strategy, config) jobs of one world size, one after the other, in one launch.

    A job that resumes (``config.resume``) may follow the job that wrote its checkpoint: the
    resumed run builds its model, optimizer and schedule afresh and reads everything else
    from the checkpoint.

    Args:
        jobs: the runs, all on the same world size.
        backend: process-group backend.
        timeout: seconds for all of them together.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.

    Returns:
        Per job, ``[rank 0's dict, rank 1's, ...]``.

    Raises:
        ValueError: no jobs, different world sizes, or a config a strategy cannot split.
    """
    sizes = {s.world_size for s, _ in jobs}
    if len(sizes) != 1:
        raise ValueError(f"the jobs need strategies of one world size, got {sorted(sizes)}")
    for s, c in jobs:
        c.check(s)
    per_rank = launch(
        train_many, sizes.pop(), backend, args=(jobs,), timeout=timeout, device=device
    )
    return [[r[i] for r in per_rank] for i in range(len(jobs))]


def run_many(
    strategies: list[Strategy],
    config: RunConfig,
    backend: Any = "auto",
    timeout: float = 300.0,
    device: str = "auto",
) -> dict[str, list[dict]]:
    """Train every strategy (all on the same world size) with one config, in one launch.

    Args:
        strategies: strategies with one ``world_size`` and distinct keys (``Strategy.key``).
        config: the run.
        backend: process-group backend.
        timeout: seconds for all of them together.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.

    Returns:
        ``{strategy.key: [rank 0's dict, rank 1's, ...]}`` in the order given.

    Raises:
        ValueError: different world sizes, two strategies with one key, or a config a
            strategy cannot split.
    """
    keys = [s.key for s in strategies]
    if len(set(keys)) != len(keys):
        raise ValueError(f"run_many needs distinct strategies, got {keys}")
    results = run_jobs([(s, config) for s in strategies], backend, timeout, device)
    return dict(zip(keys, results, strict=True))
