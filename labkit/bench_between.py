"""Calls between bursts of compute: the probes that price a training step's calls.

Introduced in notebooks/21_capstone.ipynb (the calibration), with notebook 05's model.

A collective called back to back is not the collective a training step calls: there, each
call comes after a burst of compute, and a rank that blocked while its peers computed pays
for being woken, in every step of the call that waits (on a virtual machine a halted virtual
CPU is woken by the host). ``lk.bench.calibrate`` runs these probes in each of its launches:

- ``between``: each collective at its smallest size between short bursts of compute, and a
  pipeline's hop of one float (pairs passing a message back and forth; every rank passing
  one on while all compute);
- ``sized``: the same at ``WAKE_SIZES`` (a layer's activations, a unit's parameters), and, on
  an even world above 2 ranks, each collective on pairs that call at once (tp or dp groups
  of 2 inside a larger run) — and what each pair's call costs its ranks' CPU (their
  processes' CPU time, every thread's, per burst with the call less per burst without it):
  a call inside a step's forward or backward takes that from the cores, while the other
  pairs compute through its waits.

Every sample is one iteration's time from the first rank's start to the last rank's end,
each call interleaved with the others rep by rep (the load drifts), and the bursts alone
beside them: ``labkit.costmodel.calibrate`` subtracts those.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from labkit.costmodel.calibrate import HOPS  # a pipeline's hop: between a pair, every rank busy
from labkit.costmodel.machine import P2P_BUSY

__all__ = ["BURST", "HOPS", "WAKE_OPS", "WAKE_SIZES", "between", "makespan", "sized"]

BURST = 40  # 64 x 64 matrix products between two calls: about 0.3 ms
WAKE_OPS = ("all_reduce", "all_gather", "reduce_scatter")  # what a training step calls
WAKE_SIZES = (1 << 15, 1 << 17, 1 << 20)  # bytes: activations of a small and a large layer, a unit


def makespan(starts: list[float], ends: list[float]) -> list[float]:
    """Per sample, from the first rank's start to the last rank's end (``perf_counter`` is
    the system-wide monotonic clock on Linux, so the ranks' readings compare)."""
    t = torch.tensor([*[-s for s in starts], *ends], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    k = len(starts)
    return [float(t[k + i] + t[i]) for i in range(k)]


def _per_iteration(
    calls: dict, iters: int, reps: int, cpu: dict | None = None
) -> dict[Any, list[float]]:
    """Per call, ``reps`` samples of ``iters`` calls in a row, the calls interleaved rep by
    rep: per iteration, from the first rank's start to the last one's end.

    ``cpu``, if given, gets per call the CPU seconds per iteration of the ranks' processes
    (``time.process_time``: every thread, the backend's included), the mean over ranks."""
    starts: dict[Any, list[float]] = {k: [] for k in calls}
    ends: dict[Any, list[float]] = {k: [] for k in calls}
    used: dict[Any, list[float]] = {k: [] for k in calls}
    for _ in range(reps):
        for name, call in calls.items():
            dist.barrier()
            starts[name].append(time.perf_counter())
            c0 = time.process_time()
            for _ in range(iters):
                call()
            used[name].append(time.process_time() - c0)
            ends[name].append(time.perf_counter())
    if cpu is not None:
        keys = list(calls)
        t = torch.tensor([c for k in keys for c in used[k]], dtype=torch.float64)
        dist.all_reduce(t)
        mean = (t / dist.get_world_size() / iters).tolist()
        cpu.update({k: mean[i * reps : (i + 1) * reps] for i, k in enumerate(keys)})
    return {k: [t / iters for t in makespan(starts[k], ends[k])] for k in calls}


def _burster(units: int = BURST) -> Callable[[], None]:
    """A short burst of compute: ``units`` small matrix products."""
    a, b = torch.randn(64, 64), torch.empty(64, 64)

    def burst() -> None:
        for _ in range(units):
            torch.mm(a, a, out=b)

    return burst


def _hop(burst: Callable[[], None], buf: torch.Tensor) -> Callable[[], None]:
    """Pairs pass ``buf`` back and forth, a burst between a receive and a send, as pipeline
    stages do: even ranks compute and send first, odd ranks answer (two bursts, two hops)."""
    rank = dist.get_rank()
    peer = rank ^ 1

    def hop() -> None:
        if rank % 2 == 0:
            burst()
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            burst()
            dist.send(buf, peer)

    return hop


def _busy_hop(burst: Callable[[], None], buf: torch.Tensor) -> Callable[[], None]:
    """Every rank computes a burst, then sends ``buf`` to the next rank and receives from the
    one before (a pipeline's steady state: the receiver may wait for a core)."""
    rank, p, got = dist.get_rank(), dist.get_world_size(), torch.empty_like(buf)

    def hop() -> None:
        burst()
        sent = dist.isend(buf, (rank + 1) % p)
        dist.recv(got, (rank - 1) % p)
        sent.wait()

    return hop


def _with_bursts(per: dict, keys: list) -> dict:
    """Each key's samples beside the bursts alone; a pair's hop halved (two per iteration)."""
    op = {k: k if isinstance(k, str) else k[0] for k in keys}
    half = {k: [t / 2 for t in per[k]] if op[k] == "p2p" else per[k] for k in keys}
    return {k: (half[k], per["none"]) for k in keys}


def between(iters: int, reps: int) -> dict[str, tuple[list[float], list[float]]]:
    """Each op at its smallest size between short bursts of compute, as a training step calls
    it (a ZeRO-3 unit's gather, a tensor-parallel layer's all-reduce), and a hop of one float
    (``"p2p"`` on an even world, ``"p2p_busy"``): ``op → (per burst with it, without)``."""
    p, burst = dist.get_world_size(), _burster()
    x, whole, part = torch.ones(p), torch.empty(p), torch.ones(1)
    calls = {
        "none": burst,
        "all_reduce": lambda: (burst(), dist.all_reduce(x)),
        "all_gather": lambda: (burst(), dist.all_gather_into_tensor(whole, part)),
        "reduce_scatter": lambda: (burst(), dist.reduce_scatter_tensor(part, whole)),
    }
    if p % 2 == 0:
        calls["p2p"] = _hop(burst, torch.ones(1))
    calls[P2P_BUSY] = _busy_hop(burst, torch.ones(1))
    return _with_bursts(_per_iteration(calls, iters, reps), [k for k in calls if k != "none"])


def sized(iters: int, reps: int) -> tuple[dict, dict]:
    """``WAKE_OPS`` and ``HOPS`` at ``WAKE_SIZES`` between short bursts of compute, by
    ``(op, bytes, group size)``: ``(per burst with it, without)``; collectives on the world
    and, on an even world above 2, on pairs calling at once. Second, for the pairs' calls,
    the same in CPU seconds of a rank's process (the mean over ranks)."""
    p, burst = dist.get_world_size(), _burster()
    groups = {p: None}
    if p > 2 and p % 2 == 0:  # every rank creates every group, in the same order
        pairs = [dist.new_group([2 * k, 2 * k + 1]) for k in range(p // 2)]
        groups[2] = pairs[dist.get_rank() // 2]

    def call(op: str, n: int, q: int) -> Callable[[], Any]:  # a burst, then the call
        whole, part, g = torch.zeros(n // 4), torch.zeros(n // 4 // q), groups[q]
        if op == "p2p":
            return _hop(burst, whole)
        if op == P2P_BUSY:
            return _busy_hop(burst, whole)
        if op == "all_reduce":
            return lambda: (burst(), dist.all_reduce(whole, group=g))
        if op == "all_gather":
            return lambda: (burst(), dist.all_gather_into_tensor(whole, part, group=g))
        return lambda: (burst(), dist.reduce_scatter_tensor(part, whole, group=g))

    keys = [(op, n, q) for op in WAKE_OPS for n in WAKE_SIZES for q in groups]
    hops = [h for h in HOPS if h != "p2p" or p % 2 == 0]
    keys += [(h, n, p) for h in hops for n in WAKE_SIZES]
    runs: dict[Any, Callable[[], Any]] = {"none": burst} | {k: call(*k) for k in keys}
    used: dict = {}
    wall = _with_bursts(_per_iteration(runs, iters, reps, used), keys)
    return wall, _with_bursts(used, [k for k in keys if k[2] < p])
