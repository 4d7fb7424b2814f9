"""The calibration's reduction rate against the reduction labkit_shm's all_reduce does.

Run:  .venv/bin/python benchmarks/shm_rates.py [--world-size 2] [--reps 30]

The collective model prices labkit_shm's reduction at the calibration's rate for n bytes: one
``b += a`` over two private buffers of n bytes, on every rank at once
(``labkit/bench_calibrate.py``). labkit_shm's one-shot all_reduce (up to 256 KiB; above it the
work is split into a reduce-scatter and an all-gather) instead writes its tensor's chunk into
its slot in shared memory, waits for its peers, and reduces every rank's slot into its tensor:
three buffers, two of them written a moment before, one by another core
(``labkit/backends/_shm/allreduce.py``). Per size, on every rank at once (a barrier before each
sample; the median of ``--reps``, in GB/s of n): the calibration's ``b += a``; ``dst = slot +
src`` reading this rank's own slot just written; the same reading the next rank's slot.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import labkit as lk  # noqa: E402
from labkit.bench_calibrate import _bufs, _work  # noqa: E402

SIZES = (1 << 18, 1 << 20, 1 << 22, 1 << 24)


def rank_fn(rank: int, world: int, reps: int) -> dict:
    torch.set_num_threads(1)
    out = {}
    for n in SIZES:
        path = f"/dev/shm/labkit_shm_rates_{os.getppid()}_{n}"
        if rank == 0:
            with open(path, "wb") as f:
                f.truncate(world * n)
        dist.barrier()
        slots = torch.from_file(path, shared=True, size=world * n // 4).view(world, -1)
        dist.barrier()
        if rank == 0:
            os.unlink(path)  # every rank has it mapped
        src, dst, probe = torch.ones(n // 4), torch.empty(n // 4), _bufs("add", n)
        mine, peer = slots[rank], slots[(rank + 1) % world]
        times: dict[str, list[float]] = {"calibration b += a": [], "own slot": [], "peer slot": []}
        for _ in range(reps):
            for name, t in times.items():
                mine.copy_(src)  # this rank's chunk into its slot, as the all_reduce does
                dist.barrier()
                if name.startswith("calibration"):
                    t.append(_work("add", probe, 1))
                    continue
                t0 = time.perf_counter()
                torch.add(mine if name == "own slot" else peer, src, out=dst)
                t.append(time.perf_counter() - t0)
        out[n] = {k: statistics.median(v) for k, v in times.items()}
        del slots
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    lk.launcher.settle()  # the zygote's warm-up imports, before anything is timed
    got = lk.launch(rank_fn, args.world_size, args=(args.reps,))[0]
    print(f"{args.world_size} ranks, every rank at once, median of {args.reps}, GB/s of n:")
    for n, rates in got.items():
        row = ", ".join(f"{k} {n / t / 1e9:5.1f}" for k, t in rates.items())
        print(f"{n >> 10:6d} KB: {row}")
    lk.shutdown()


if __name__ == "__main__":
    main()
