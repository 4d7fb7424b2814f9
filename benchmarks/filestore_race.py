"""How often torch's FileStore leaves its file behind when the ranks leave at the same moment.

    .venv/bin/python benchmarks/filestore_race.py --rounds 200 --processes 4

A ``file://`` rendezvous keeps its keys in one file; torch removes it when the last FileStore
on it is destroyed (torch/csrc/distributed/c10d/FileStore.cpp, ``~FileStore``). The destructor
does that with two adds, each under the file's lock but not under one lock together: the
clean-up count (``cleanup/`` += 1) and then the reference count (``refcount/`` -= 1), and
removes the file only if *its* reference count reached 0 *and its* clean-up count reached the
number of workers. When two processes run it at the same moment, the one whose reference
count reaches 0 can have read the clean-up count before the other's add, and the other read
the full clean-up count with a reference still held: neither removes the file. What it leaves
shows that: ``refcount/`` 0 and ``cleanup/`` equal to the number of workers.

Each round: ``--processes`` forked processes open a FileStore on a fresh path, write a key,
wait at one event and then drop the store together. The script prints each round that left
the file with its two counts, then ``left behind K of N``. No labkit in it: the race is
torch's. Notebook 00's ``file://`` lab met it once in a workshop room of 8 learners under load
(benchmarks/RESULTS.md, "A workshop room on one machine").
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import struct
import tempfile
import time


def _hold_then_drop(path: str, n: int, ready, go) -> None:
    import torch.distributed as dist

    store = dist.FileStore(path, n)
    store.set("key", "1")
    ready.release()
    go.wait()
    del store  # ~FileStore: the clean-up the race is in


def counts(path: str) -> dict[str, str]:
    """The internal counters of a FileStore file: records of (u32 length, key, u32 length,
    value), the last record of a key wins."""
    raw, pos, out = open(path, "rb").read(), 0, {}
    while pos < len(raw):
        (n,) = struct.unpack_from("I", raw, pos)
        key = raw[pos + 4 : pos + 4 + n].decode()
        pos += 4 + n
        (n,) = struct.unpack_from("I", raw, pos)
        out[key] = raw[pos + 4 : pos + 4 + n].decode()
        pos += 4 + n
    return {k: v for k, v in out.items() if k in ("cleanup/", "refcount/")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--processes", type=int, default=4)
    args = ap.parse_args()
    import torch.distributed  # noqa: F401 - imported once, before the forks

    ctx = mp.get_context("fork")
    left = 0
    start = time.perf_counter()
    for i in range(args.rounds):
        folder = tempfile.mkdtemp()
        path = os.path.join(folder, "rendezvous")
        ready, go = ctx.Semaphore(0), ctx.Event()
        procs = [
            ctx.Process(target=_hold_then_drop, args=(path, args.processes, ready, go))
            for _ in range(args.processes)
        ]
        for p in procs:
            p.start()
        for _ in procs:
            ready.acquire()
        go.set()
        for p in procs:
            p.join()
        if os.path.exists(path):
            left += 1
            print(f"round {i}: left behind, {counts(path)}", flush=True)
        shutil.rmtree(folder)
    took = time.perf_counter() - start
    print(f"left behind {left} of {args.rounds} ({args.processes} processes, {took:.0f} s)")


if __name__ == "__main__":
    main()
