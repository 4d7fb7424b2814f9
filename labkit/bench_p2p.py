"""Point-to-point ping-pong: one-way latency and bandwidth between two ranks.

Introduced in notebooks/01_point_to_point.ipynb (``labkit.bench`` re-exports it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable

import torch
import torch.distributed as dist

from labkit.bench_results import GB, BenchResult, check_sizes, default_device
from labkit.trace import sync_device

__all__ = ["p2p_pingpong"]


def p2p_pingpong(
    sizes_bytes: Iterable[int],
    iters: int = 20,
    warmup: int = 3,
    group: dist.ProcessGroup | None = None,
    src: int = 0,
    dst: int = 1,
    device: torch.device | str | None = None,
) -> list[BenchResult]:
    """Time a ping-pong between ranks ``src`` and ``dst``: one-way latency and bandwidth.

    For each size, ``src`` sends ``n`` bytes to ``dst``, which sends them straight back; the
    round trip is timed with ``time.perf_counter`` on ``src`` and halved (the classic MPI
    ping-pong, e.g. the Intel MPI Benchmarks' PingPong and OSU's ``osu_latency``). Timing the
    round trip on one rank needs no synchronised clocks. The echoed bytes are compared with
    the sent ones once per size.

    Call it on every rank of the group (e.g. inside ``lk.launch``); ranks other than ``src``
    and ``dst`` return at once.

    Args:
        sizes_bytes: message sizes in bytes (sorted and deduplicated; see ``message_sizes``).
        iters: timed round trips per size (median in ``time_s``, fastest in ``time_min_s``).
        warmup: untimed round trips per size first (connection set-up, allocation).
        group: the process group (default: the default group).
        src: global rank that sends first and measures.
        dst: global rank that echoes.
        device: where the buffers live (default: the launcher's device for this rank).

    Returns:
        On ``src``: one ``BenchResult`` (op ``"p2p"``) per size, in increasing size; its
        ``time_s`` is the median one-way time, ``times_s`` every sample, and
        ``algbw_gbps == busbw_gbps`` is ``n_bytes / time_s / 1e9``. On every other rank: an
        empty list.

    Raises:
        ValueError: bad sizes or counts, or ``src == dst``.
        RuntimeError: the echoed bytes differ from the sent ones.
    """
    sizes = check_sizes(sizes_bytes)
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}")
    if src == dst:
        raise ValueError(f"src and dst must be different ranks, got {src} and {dst}")
    rank = dist.get_rank()
    if rank not in (src, dst) or dist.get_rank(group) < 0:  # -1: not a member of ``group``
        return []
    device = torch.device(device) if device is not None else default_device()
    peer = dst if rank == src else src
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in sizes:
        buf = torch.empty(n, dtype=torch.uint8, device=device)
        if rank == src:  # random bytes, so a wrong echo cannot pass by accident
            msg = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen).to(device)
        samples = []
        for i in range(warmup + iters):
            sync_device(device)
            start = time.perf_counter()
            if rank == src:
                dist.send(msg, peer, group=group)
                dist.recv(buf, peer, group=group)
            else:
                dist.recv(buf, peer, group=group)
                dist.send(buf, peer, group=group)
            sync_device(device)
            if i >= warmup:
                samples.append((time.perf_counter() - start) / 2)  # one way = half a trip
        if rank == dst:
            continue
        if not torch.equal(buf, msg):
            raise RuntimeError(f"ping-pong of {n} bytes came back changed")
        t = statistics.median(samples)
        rows.append(
            BenchResult(
                op="p2p",
                n_bytes=n,
                time_s=t,
                algbw_gbps=n / t / GB,
                busbw_gbps=n / t / GB,
                world_size=dist.get_world_size(group),
                backend=str(dist.get_backend(group)),
                device=str(device),
                iters=iters,
                times_s=tuple(samples),
            )
        )
    return rows
