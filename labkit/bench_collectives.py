"""Collective benchmark in the manner of nccl-tests: time, algbw and busbw per message size.

Introduced in notebooks/05_communication_cost.ipynb.

``lk.bench.collective`` (re-exported by ``labkit.bench``) times ``all_reduce``,
``all_gather``, ``reduce_scatter``, ``broadcast`` or ``all_to_all`` over whatever backend
the group uses. Sizes follow nccl-tests (``doc/PERFORMANCE.md``): n is the whole buffer —
the tensor for all_reduce and broadcast, the gathered output for all_gather, each rank's
input for reduce_scatter and all_to_all. Rows are ``lk.bench.BenchResult``, with
``busbw = algbw · lk.costmodel.busbw_factor(op, p)``. Every rank calls it and gets the same
rows:

    rows = lk.launch(lambda r, w: lk.bench.collective("all_reduce", [8, 1 << 20]), 4)[0]
    print(lk.bench.format_table(rows))

From a shell (``labkit.bench.launch_collective``):
``labkit bench --collective all_reduce --world-size 4 --backend gloo``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from labkit.bench_results import GB, BenchResult, check_sizes, default_device
from labkit.costmodel import busbw_factor
from labkit.trace import sync_device

__all__ = ["COLLECTIVES", "collective", "collective_sizes"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
ELEMENT_BYTES = 4  # float32, as nccl-tests' default -d float
_CHUNKED = ("all_gather", "reduce_scatter", "all_to_all")  # n splits into p equal blocks


def collective_sizes(fast: bool = False) -> list[int]:
    """Default sizes in bytes: 8 B to 32 MB by factors of 4 (four sizes when ``fast``).

    Args:
        fast: a few sizes only (8 B, 1 KB, 128 KB, 1 MB), for a 2-core laptop.

    Returns:
        Increasing sizes in bytes.
    """
    if fast:
        return [8, 1 << 10, 1 << 17, 1 << 20]
    return [8 * 4**k for k in range(12)]  # 8 B ... 32 MB


def _elements(name: str, n_bytes: int, world_size: int) -> int:
    """float32 elements benchmarked for ``n_bytes``: whole elements, p equal blocks if split."""
    numel = max(1, n_bytes // ELEMENT_BYTES)
    if name in _CHUNKED:
        numel = max(world_size, numel - numel % world_size)
    return numel


def _make_op(
    name: str, numel: int, world_size: int, device: torch.device, group, root: int
) -> Callable[[], object]:
    """A no-argument function running one ``name`` collective on freshly allocated buffers."""
    block = numel // world_size if name in _CHUNKED else numel
    if name == "all_reduce":
        buf = torch.ones(numel, device=device)
        return lambda: dist.all_reduce(buf, group=group)
    if name == "broadcast":
        buf = torch.ones(numel, device=device)
        return lambda: dist.broadcast(buf, src=root, group=group)
    if name == "all_gather":
        inp, out = torch.ones(block, device=device), torch.empty(numel, device=device)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if name == "reduce_scatter":
        inp, out = torch.ones(numel, device=device), torch.empty(block, device=device)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    if name == "all_to_all":
        inp, out = torch.ones(numel, device=device), torch.empty(numel, device=device)
        return lambda: dist.all_to_all_single(out, inp, group=group)
    raise ValueError(f"unknown collective {name!r}; known: {', '.join(COLLECTIVES)}")


def collective(
    name: str,
    sizes_bytes: Iterable[int] | None = None,
    iters: int = 20,
    warmup: int = 3,
    group: dist.ProcessGroup | None = None,
    device: torch.device | str | None = None,
) -> list[BenchResult]:
    """Time one collective per message size on every rank of ``group``, like nccl-tests.

    Each timed call starts after a barrier; a sample is the slowest rank's time (the
    collective is done when its last rank is), gathered with one MAX all-reduce at the end;
    ``time_s`` is the median over ``iters`` samples, ``times_s`` keeps them all. Bandwidths
    follow nccl-tests ``doc/PERFORMANCE.md``: ``algbw = n / time_s`` and ``busbw = algbw ·
    busbw_factor(name, p)`` (all_reduce 2(p−1)/p; all_gather, reduce_scatter, all_to_all
    (p−1)/p; broadcast 1). Buffers are float32; each size is rounded down to whole elements
    (all_gather, reduce_scatter, all_to_all: to p equal blocks, at least one element each),
    and the row records the bytes actually moved.

    Call it on every rank (e.g. inside ``lk.launch``); ranks outside ``group`` return ``[]``.

    Args:
        name: ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``, ``"broadcast"`` or
            ``"all_to_all"``.
        sizes_bytes: sizes n in bytes, nccl-tests' convention (default: ``collective_sizes()``).
        iters: timed calls per size.
        warmup: untimed calls per size first.
        group: the process group (default: the default group).
        device: where the buffers live (default: the launcher's device for this rank).

    Returns:
        One ``BenchResult`` per distinct (rounded) size, in increasing size, on every rank
        of the group (the same rows everywhere).

    Raises:
        ValueError: an unknown collective, bad sizes or counts.
    """
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(COLLECTIVES)}")
    sizes = check_sizes(collective_sizes() if sizes_bytes is None else sizes_bytes)
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}")
    if dist.get_rank(group) < 0:  # -1: this rank is not a member of ``group``
        return []
    device = torch.device(device) if device is not None else default_device()
    p = dist.get_world_size(group)
    root = dist.get_global_rank(group, 0) if group is not None else 0
    numels = sorted({_elements(name, n, p) for n in sizes})
    samples = torch.zeros(len(numels), iters, dtype=torch.float64)
    for i, numel in enumerate(numels):
        op = _make_op(name, numel, p, device, group, root)
        for _ in range(warmup):
            op()
        for k in range(iters):
            dist.barrier(group=group)
            sync_device(device)
            start = time.perf_counter()
            op()
            sync_device(device)
            samples[i, k] = time.perf_counter() - start
    slowest = samples.to(device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    slowest = slowest.cpu()
    factor = busbw_factor(name, p)
    backend = str(dist.get_backend(group))
    rows = []
    for i, numel in enumerate(numels):
        n_bytes = numel * ELEMENT_BYTES
        times = tuple(slowest[i].tolist())
        t = statistics.median(times)
        rows.append(
            BenchResult(
                op=name,
                n_bytes=n_bytes,
                time_s=t,
                algbw_gbps=n_bytes / t / GB,
                busbw_gbps=n_bytes / t / GB * factor,
                world_size=p,
                backend=backend,
                device=str(device),
                iters=iters,
                times_s=times,
            )
        )
    return rows
