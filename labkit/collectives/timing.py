"""Time all-reduce implementations against each other on this machine, fairly and in one run.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

Shared machines are noisy (repeated runs can vary by up to 2×), so the implementations
take turns: for every size and repeat, each runs once, in the same order, after a barrier.
A sample is the slowest rank's time (an all-reduce is done when the last rank is done), and
the result is the median over repeats. Compare the ratios within one run, not across runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from labkit.trace import sync_device

__all__ = ["time_allreduce"]


def time_allreduce(
    fns: Mapping[str, Callable[[torch.Tensor], object]],
    sizes: Sequence[int],
    *,
    repeats: int = 5,
    warmup: int = 1,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    group: dist.ProcessGroup | None = None,
) -> dict[str, list[float]]:
    """Median seconds of one all-reduce for every implementation and tensor size.

    Call on every rank of ``group`` (e.g. inside ``lk.launch``); every rank gets the same
    answer. Each sample starts after a barrier and counts until this rank returns; the
    slowest rank's time is kept (one MAX all-reduce at the end), as nccl-tests does.

    Args:
        fns: name → function all-reducing its tensor argument in place, e.g.
            ``{"ring": partial(lk.collectives.allreduce_ring, check=False),
            "dist.all_reduce": dist.all_reduce}``.
        sizes: tensor sizes in elements.
        repeats: timed runs per implementation and size (the median is reported).
        warmup: untimed runs per implementation and size first.
        dtype: element type of the tensors.
        device: where the tensors live (``lk.get_device()`` inside a rank).
        group: the process group (default: the default group).

    Returns:
        ``{name: [median seconds per size]}``, sizes in the order given.

    Raises:
        ValueError: ``repeats < 1`` or a negative size.
    """
    if repeats < 1 or any(n < 0 for n in sizes):
        raise ValueError(f"need repeats >= 1 and sizes >= 0, got {repeats} and {list(sizes)}")
    device = torch.device(device)
    names = list(fns)
    samples = torch.zeros(len(names), len(sizes), repeats, dtype=torch.float64)
    for j, numel in enumerate(sizes):
        x = torch.ones(numel, dtype=dtype, device=device)
        for _ in range(warmup):
            for name in names:
                fns[name](x.clone())
        for k in range(repeats):
            for i, name in enumerate(names):
                t = x.clone()
                dist.barrier(group=group)
                sync_device(device)
                start = time.perf_counter()
                fns[name](t)
                sync_device(device)
                samples[i, j, k] = time.perf_counter() - start
    samples = samples.to(device)
    dist.all_reduce(samples, op=dist.ReduceOp.MAX, group=group)
    samples = samples.cpu()
    return {
        name: [statistics.median(samples[i, j].tolist()) for j in range(len(sizes))]
        for i, name in enumerate(names)
    }
