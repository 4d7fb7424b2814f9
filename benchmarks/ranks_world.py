"""lk.World: start-up, cell round trip, stop, and what is left after the kernel is SIGKILLed.

Run:  .venv/bin/python benchmarks/ranks_world.py [--world-size 4] [--cells 50]

Prints: the start of a world when the kernel has no zygote yet (it imports torch) and when it
has one; the mean round trip of a trivial cell and of a cell with one ``dist.all_reduce``;
``close()``; and, for a child process holding a world that is SIGKILLed, how long until every
rank process is gone (polled with psutil). Numbers are quoted in docs/ranks.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import psutil

import labkit as lk

HOLD_WORLD = (
    "import time, labkit as lk\n"
    "w = lk.World(world_size={n})\n"
    "print(' '.join(map(str, w.pids)), flush=True)\n"
    "time.sleep(60)\n"
)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--cells", type=int, default=50)
    args = parser.parse_args()
    n = args.world_size

    t = time.perf_counter()
    lk.World(world_size=n).close()
    cold = time.perf_counter() - t
    t = time.perf_counter()
    world = lk.World(world_size=n)
    warm = time.perf_counter() - t
    world.run("x = torch.ones(1)", show=False)
    timings = {}
    for label, cell in (("y = 1", "y = 1"), ("dist.all_reduce(x)", "dist.all_reduce(x)")):
        t = time.perf_counter()
        for _ in range(args.cells):
            world.run(cell, show=False)
        timings[label] = (time.perf_counter() - t) / args.cells
    t = time.perf_counter()
    world.close()
    close = time.perf_counter() - t

    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_WORLD.format(n=n)], stdout=subprocess.PIPE, text=True
    )
    pids = [int(p) for p in child.stdout.readline().split()]
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    t = time.perf_counter()
    while any(_running(p) for p in pids) and time.perf_counter() - t < 30:
        time.sleep(0.01)
    gone = time.perf_counter() - t
    left = [p for p in pids if _running(p)]

    print(f"lk.World({n}) start: {cold:.2f} s without a zygote, {warm:.2f} s with one")
    for label, s in timings.items():
        print(f"cell `{label}`: {s * 1e3:.1f} ms per cell (mean of {args.cells})")
    print(f"close(): {close:.2f} s")
    print(f"kernel SIGKILLed: {len(pids) - len(left)} of {len(pids)} ranks gone after {gone:.2f} s")


if __name__ == "__main__":
    main()
