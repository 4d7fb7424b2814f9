"""Calibrate the machine model: the microbenchmarks behind ``lk.costmodel.MachineModel``.

Introduced in notebooks/05_communication_cost.ipynb.

One launch per backend and world size measures, in a few seconds (``fast``), what
``labkit.costmodel.calibrate`` needs: a ping-pong and an exchange between two ranks (α, β,
duplex), every collective at its smallest size and a barrier (the per-call overhead, the cost
of a round), and, in the gloo launches, the machine itself: a one-core memcpy and a reduction
pass (c, γ), and a fixed amount of memory-bound work and of a small transformer block's forward
and backward done by one rank alone and then by all ranks at once (how ranks share the cores);
each collective and a pipeline's hop between short bursts of compute, at its smallest size
and at the sizes a training step's calls have (``labkit.bench_between``); and, last, the
hand-off between ranks 0 and 1 (``labkit.bench_handoff``: what a byte one core has written
costs another to read, in the state the host keeps the cores in next)::

    machine, probes = lk.bench.calibrate(["gloo", "labkit_shm"], world_sizes=(2, 4), fast=True)
    lk.costmodel.predict_collective(machine, "gloo", "all_reduce", 1 << 20, 4)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from labkit.bench_between import between, makespan, sized
from labkit.bench_collectives import collective
from labkit.bench_handoff import handoff
from labkit.bench_p2p import p2p_pingpong
from labkit.costmodel.calibrate import (
    BackendProbes,
    Probes,
    machine_from_probes,
    pool_pairs,
    pool_rows,
)
from labkit.costmodel.machine import MachineModel
from labkit.costmodel.recipes import KINDS
from labkit.launcher import launch, settle

__all__ = ["TINY_OPS", "add_launch", "calibrate", "measure_probes", "probe_rank"]

TINY_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier")
MACHINE_BACKEND = "gloo"  # its waits block in the kernel: a waiting rank leaves its core free
COPY_SIZES = (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)  # bytes: in cache up to memory


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _slowest(samples: list[float]) -> list[float]:
    """Per sample, the slowest rank's value (one MAX all-reduce)."""
    t = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _tiny(iters: int) -> dict[str, list[float]]:
    """Every op at its smallest size (one float per rank), after a barrier each time."""
    p, out = dist.get_world_size(), {}
    for op in TINY_OPS:
        if op == "barrier":
            samples = []
            for _ in range(iters + 2):
                dist.barrier()
                t0 = time.perf_counter()
                dist.barrier()
                samples.append(time.perf_counter() - t0)
            out[op] = _slowest(samples[2:])
        else:
            out[op] = list(collective(op, [4 * p], iters=iters, warmup=2)[0].times_s)
    return out


def _exchange(n_bytes: int, iters: int) -> tuple[list[float], list[float]]:
    """Pairs (0, 1), (2, 3) … send and receive ``n_bytes`` at once, then one way only."""
    rank = dist.get_rank()
    a, b, peer = torch.ones(n_bytes // 4), torch.empty(n_bytes // 4), rank ^ 1
    both, one = [], []
    for _k in range(iters + 1):
        ops = [dist.P2POp(dist.isend, a, peer), dist.P2POp(dist.irecv, b, peer)]
        dist.barrier()
        t0 = time.perf_counter()
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        both.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        if rank % 2 == 0:
            dist.send(a, peer)
        else:
            dist.recv(b, peer)
        one.append(time.perf_counter() - t0)
    return _slowest(both[1:]), _slowest(one[1:])


def _work(kind: str, bufs: tuple[Any, torch.Tensor], units: int) -> float:
    """Seconds of ``units`` copies of a buffer, reduction passes, or forward and backward
    passes of a small transformer block."""
    a, b = bufs
    t0 = time.perf_counter()
    for _ in range(units):
        if kind == "copy":
            b.copy_(a)
        elif kind == "add":
            b.add_(a)
        else:
            a(b).sum().backward()
    return time.perf_counter() - t0


def _bufs(kind: str, n_bytes: int) -> tuple[Any, torch.Tensor]:
    if kind == "block":  # compute as a small model's layers run it, not a peak matmul
        torch.manual_seed(0)
        block = torch.nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
        return block, torch.randn(8, 32, 64)
    return torch.ones(n_bytes // 4), torch.ones(n_bytes // 4)


def _alone_then_together(
    kind: str, n_bytes: int, units: int, reps: int
) -> tuple[list[float], list[float]]:
    """The same work by rank 0 alone (the others wait in a barrier), then by every rank at
    once: from the first rank's start to the last one's end, which counts a rank that waits
    for a core as well as one that runs slower."""
    bufs = _bufs(kind, n_bytes)
    _work(kind, bufs, 1)  # touch the pages
    dist.barrier()
    alone = [_work(kind, bufs, units) for _ in range(reps)] if dist.get_rank() == 0 else []
    starts, ends = [], []
    for _ in range(reps):
        dist.barrier()
        starts.append(time.perf_counter())
        _work(kind, bufs, units)
        ends.append(time.perf_counter())
    return alone, makespan(starts, ends)


def _machine(fast: bool) -> dict:
    """Copy and reduction rates per size (alone, then all ranks at once), compute sharing."""
    reps, out = (3 if fast else 7), {"copy": {}, "add": {}}
    for kind in ("copy", "add"):
        for n in COPY_SIZES:
            units = max(1, (32 << 20) // n)  # 32 MB of work per sample: longer than a skew
            alone, together = _alone_then_together(kind, n, units, reps)
            per_unit = [t / units for t in alone], [t / units for t in together]
            out[kind][n] = per_unit
    # several milliseconds a sample, more samples: one preempted sample must not be the median
    out["compute"] = _alone_then_together("block", 0, 4, 2 * reps + 1)
    return out


def probe_rank(rank: int, world_size: int, machine: bool = False, fast: bool = True) -> dict:
    """Every microbenchmark of one launch, on this rank (call it on every rank).

    Args:
        rank, world_size: as ``lk.launch`` passes them.
        machine: also measure the machine (copy and reduction rates, compute sharing): do it
            on a backend whose waits leave the core free (gloo).
        fast: fewer samples.

    Returns:
        Raw samples for ``add_launch`` (rank 0's are the ones kept).
    """
    torch.set_num_threads(1)  # one core per rank, as the course's ranks run
    iters = 8 if fast else 20
    reps = 5 if fast else 9  # calls between bursts vary the most: a median of more samples
    # the calls between bursts first (a step's prices; after the wire's first half): the
    # back-to-back probes then stay seconds before what a launch measures after them
    # (``then``), as they always were. The wire twice, first and after those probes, seconds
    # apart: a host that slows the transfers between two cores for a few seconds
    # (benchmarks/handoff.py) then rarely covers both
    out: dict = {}
    wire = [_wire(iters)] if world_size == 2 else []
    out["sized"], out["sized_cpu"] = sized(iters, reps)
    out["between"] = between(iters, reps)
    out["tiny"] = _tiny(iters)
    pg = dist.group.WORLD
    out["chunk_bytes"] = int(getattr(pg, "slot_bytes", 0))
    if wire:
        (first, (n, *pair)), (again, (_, *more)) = wire[0], _wire(iters)
        out["p2p"] = pool_rows(first, again)
        exchange = {n: tuple(pair)}
        pool_pairs(exchange, {n: tuple(more)})
        out["exchange"] = [(n, *exchange[n])]
    if machine:
        out["machine"] = _machine(fast)
    out["handoff"] = handoff(reps=10 if fast else 30)  # last: the state the host keeps next
    return out


def _wire(iters: int) -> tuple[list, tuple]:
    """A ping-pong at four sizes and a 4 MB exchange, on 2 ranks: ``(p2p rows, exchange)``."""
    rows = p2p_pingpong([8, 1 << 16, 1 << 20, 1 << 22], iters=iters, warmup=2)
    n = 1 << 22
    return [(r.n_bytes, list(r.times_s)) for r in rows], (n, *_exchange(n, iters))


def _probe_then(rank: int, world_size: int, machine: bool, fast: bool, then: Callable | None):
    return probe_rank(rank, world_size, machine, fast), then(rank, world_size) if then else None


def measure_probes(
    backends: Sequence[str] = KINDS,
    world_sizes: Sequence[int] = (2, 4),
    fast: bool = True,
    timeout: float = 300.0,
    then: Callable[[int, int], Any] | None = None,
    results: dict | None = None,
) -> Probes:
    """Run the microbenchmarks: one launch per backend and world size (rank 0's samples).

    Args:
        backends: backend names (``"gloo"``, ``"labkit_shm"``).
        world_sizes: ranks to calibrate (2 is always measured: the ping-pong needs it).
        fast: fewer samples (seconds in all).
        timeout: seconds per launch.
        then: ``then(rank, world_size)`` runs on every rank of each launch right after the
            probes (e.g. the measurements the model will be compared with, taken seconds
            after its inputs on a machine whose load drifts).
        results: where ``then``'s rank-0 results go, by ``(backend, world_size)``.

    Returns:
        The raw ``Probes``.

    Raises:
        ValueError: a backend without recipes.
    """
    for b in backends:
        if b not in KINDS:
            raise ValueError(f"no recipes for backend {b!r}; calibrate one of {KINDS}")
    sizes = sorted({2, *world_sizes})
    order = [MACHINE_BACKEND, *[b for b in backends if b != MACHINE_BACKEND]]
    probes = Probes(cores=_cores())
    settle()  # the zygote's warm-up imports, before anything is timed beside them
    for b in order:
        for p in sizes:
            args = (b == MACHINE_BACKEND, fast, then if b in backends else None)
            probe, after = launch(_probe_then, p, backend=b, args=args, timeout=timeout)[0]
            add_launch(probes, b, p, probe)
            if results is not None and then is not None and b in backends:
                results[(b, p)] = after
    probes.backends = [next(x for x in probes.backends if x.name == b) for b in backends]
    return probes


def add_launch(probes: Probes, backend: str, world_size: int, result: dict) -> None:
    """Add one launch's samples (``probe_rank``'s, on ``world_size`` ranks) to ``probes``.

    Samples of the same term from several launches are pooled.

    Args:
        probes: the ``Probes`` being filled (changed in place).
        backend: the launch's backend.
        world_size: its ranks.
        result: rank 0's ``probe_rank`` result.
    """
    bp = next((x for x in probes.backends if x.name == backend), None)
    if bp is None:
        bp = BackendProbes(backend, backend)
        probes.backends.append(bp)
    p, r = world_size, result
    for op, samples in r["tiny"].items():
        bp.tiny[(op, p)] = [*bp.tiny.get((op, p), []), *samples]
    pool_pairs(bp.between, {(op, p): pair for op, pair in r["between"].items()})
    for name in ("sized", "sized_cpu"):
        pool_pairs(
            getattr(bp, name), {(op, q, n, p): v for (op, n, q), v in r.get(name, {}).items()}
        )
    bp.chunk_bytes[p] = r["chunk_bytes"]
    if r.get("handoff"):
        h = r["handoff"]
        pool_pairs(bp.handoff, {(p, h["n_bytes"]): (h["round_s"], h["private_s"])})
    if "p2p" in r:
        bp.p2p = pool_rows(bp.p2p, r["p2p"])
        before = {n: (both, one) for n, both, one in bp.exchange}
        bp.exchange = [
            (n, [*before.get(n, ([], []))[0], *both], [*before.get(n, ([], []))[1], *one])
            for n, both, one in r["exchange"]
        ]
    if "machine" in r:
        m = r["machine"]
        for kind, table in (("copy", probes.copy), ("add", probes.add)):
            for q, pick_ in ((1, 0), (p, 1)):
                table[q] = pool_rows(table.get(q, []), [(n, v[pick_]) for n, v in m[kind].items()])
        pool_pairs(probes.compute_share, {p: m["compute"]})
        # one rank alone, every launch's samples: the machine's own drift (p = 1)
        alone = [*probes.compute_share.get(1, ([], []))[0], *m["compute"][0]]
        probes.compute_share[1] = (alone, alone)


def calibrate(
    backends: Sequence[str] = KINDS,
    world_sizes: Sequence[int] = (2, 4),
    fast: bool = True,
    stat: str = "min",
    then: Callable[[int, int], Any] | None = None,
    results: dict | None = None,
) -> tuple[MachineModel, Probes]:
    """Measure this machine and return its calibrated model (and the raw samples).

    Args:
        backends: backend names (``"gloo"``, ``"labkit_shm"``).
        world_sizes: ranks to calibrate.
        fast: fewer samples (a few seconds in all).
        stat: ``"min"`` (the machine at its best) or ``"median"`` (a typical call).
        then, results: as ``measure_probes`` (run right after the probes in each launch).

    Returns:
        ``(MachineModel, Probes)``.
    """
    probes = measure_probes(backends, world_sizes, fast, then=then, results=results)
    return machine_from_probes(probes, stat, name="calibrated"), probes
