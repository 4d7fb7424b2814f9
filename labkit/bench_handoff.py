"""The hand-off between two cores: how long a rank takes to read bytes a peer has just written.

Introduced in notebooks/05_communication_cost.ipynb (section 10, the calibration's last probe);
``benchmarks/handoff.py`` follows it over time.

labkit_shm moves every byte this way: a rank writes a chunk into its slot of shared memory,
and its peers copy it out. The calibration prices copies at the rate of one copy between two
private buffers (``labkit/bench_calibrate.py``). A copy whose source another core has just
written is slower, because every cache line comes from the other core's cache, and how much
slower depends on where those cores are (on one chip that shares a last-level cache or not:
on a virtual machine, wherever the host runs its virtual CPUs, which can change while a
program runs). ``handoff`` measures both copies side by side, so a benchmark can say what
state the machine was in when it measured.

Only ranks ``a`` and ``b`` work; any backend (the buffer is a file in /dev/shm, mapped by
both, not the backend's). Every wait has a deadline and names the rank that missed it.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import time

import torch
import torch.distributed as dist

from labkit.backends._shm.segment import SHM_DIR

__all__ = ["handoff"]

_FLAGS = 4096  # a page of flags before the data: word 0 is a's round, word 8 b's
_SPINS = 2000  # polls before a waiter starts to yield (tens of microseconds)


def _wait(flags: memoryview, word: int, value: int, deadline: float, rank: int, who: int):
    """Spin until ``flags[word] == value``; after a while yield the core each time round (a
    peer that shares this core cannot run while it spins)."""
    polls = 0
    while flags[word] != value:
        polls += 1
        if polls > _SPINS:
            os.sched_yield()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"lk.bench handoff: rank {rank} waited for rank {who} past the deadline "
                    f"(round {value}); is rank {who} alive and calling handoff too?"
                )


def _map(rank: int, a: int, n_bytes: int) -> tuple[mmap.mmap, str]:
    """Rank ``a`` creates the file and sends its name (to every rank: a collective); ``b``
    opens it."""
    name: list = [None]
    fd = -1
    if rank == a:
        fd, name[0] = tempfile.mkstemp(prefix="labkit-handoff-", dir=SHM_DIR)
        os.ftruncate(fd, _FLAGS + n_bytes)
    dist.broadcast_object_list(name, src=a)
    if rank != a:
        fd = os.open(name[0], os.O_RDWR)
    try:
        return mmap.mmap(fd, _FLAGS + n_bytes), name[0]
    finally:
        os.close(fd)


def handoff(
    n_bytes: int = 1 << 20,
    reps: int = 20,
    a: int = 0,
    b: int = 1,
    timeout: float = 30.0,
) -> dict | None:
    """Samples of one hand-off of ``n_bytes`` from rank ``a`` to rank ``b`` and back to ``a``.

    Call it on every rank of the world (the others wait in a barrier). ``reps`` times, timed
    on ``a``: ``a`` copies a private buffer into the shared one (whose lines ``b`` read the
    time before: ``b``'s copies must be invalidated) and raises its flag; ``b`` waits for the
    flag, copies the shared buffer into a private one (every line from ``a``'s cache), and
    raises its own; ``a`` waits for that. Then ``a`` times one copy between two private
    buffers of ``n_bytes``: two of those are what the round would cost if both copies ran
    at private speed.

    Returns:
        On rank ``a``: ``{"n_bytes": n_bytes, "round_s": [...], "private_s": [...]}``, the
        ``reps`` samples of each, in seconds; ``None`` on every other rank.

    Raises:
        ValueError: ``a == b``, a rank outside the world, ``n_bytes`` or ``reps`` < 1.
        RuntimeError: the peer did not answer within ``timeout`` seconds.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if a == b or not (0 <= a < world and 0 <= b < world) or n_bytes < 1 or reps < 1:
        raise ValueError(
            f"handoff needs two different ranks below {world}, n_bytes >= 1 and reps >= 1; "
            f"got a={a}, b={b}, n_bytes={n_bytes}, reps={reps}"
        )
    if rank not in (a, b):
        dist.broadcast_object_list([None], src=a)  # the file's name, for b
        dist.barrier()  # b has it mapped
        dist.barrier()  # the pair is done
        return None
    mm, path = _map(rank, a, n_bytes)
    try:
        dist.barrier()
    finally:
        if rank == a:
            os.unlink(path)  # both have it mapped (or failed): nothing is left in /dev/shm
    flags = memoryview(mm)[:_FLAGS].cast("q")
    shared = torch.frombuffer(mm, dtype=torch.uint8, count=n_bytes, offset=_FLAGS)
    mine, times = torch.ones(n_bytes, dtype=torch.uint8), []
    deadline = time.monotonic() + timeout
    for i in range(1, reps + 2):  # the first round touches the pages: dropped
        if rank == a:
            t0 = time.perf_counter()
            shared.copy_(mine)
            flags[0] = i
            _wait(flags, 8, i, deadline, rank, b)
            times.append(time.perf_counter() - t0)
        else:
            _wait(flags, 0, i, deadline, rank, a)
            mine.copy_(shared)
            flags[8] = i
    out = None
    if rank == a:
        other, private = torch.ones(n_bytes, dtype=torch.uint8), []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            other.copy_(mine)
            private.append(time.perf_counter() - t0)
        out = {"n_bytes": n_bytes, "round_s": times[1:], "private_s": private[1:]}
    del flags, shared
    mm.close()
    dist.barrier()
    return out
