"""Launch latency: lk.launch (first and repeated) against torch.multiprocessing.spawn.

Run:  .venv/bin/python benchmarks/launch.py [--repeats 5] [--world-sizes 2,4] [--out FILE]

Every number comes from this run on this machine; the machine is noisy, so read the ratios.
Each launch does the same work: start the ranks, init_process_group("gloo"), one barrier,
destroy the group, return to the caller. The spawn baseline is the classic recipe
(``mp.spawn`` + ``init_process_group(init_method="tcp://127.0.0.1:PORT")``), which is what a
course without a launcher makes learners write in a script. lk.launch's first launch is timed in
a fresh process (it starts the warm worker that imports torch once); repeated launches reuse it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn_worker(rank: int, world_size: int, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    dist.barrier()
    dist.destroy_process_group()


def time_spawn(world_size: int) -> float:
    import torch.multiprocessing as mp

    t0 = time.perf_counter()
    mp.spawn(_spawn_worker, args=(world_size, _free_port()), nprocs=world_size, join=True)
    return time.perf_counter() - t0


_LABKIT_CHILD = """
import json, sys, time
import torch  # a notebook has torch imported before its first launch
import labkit as lk

def fn(rank, world_size):
    import torch.distributed as dist
    dist.barrier()

ws, repeats = int(sys.argv[1]), int(sys.argv[2])
t0 = time.perf_counter(); lk.launch(fn, world_size=ws); first = time.perf_counter() - t0
again = []
for _ in range(repeats):
    t0 = time.perf_counter(); lk.launch(fn, world_size=ws); again.append(time.perf_counter() - t0)
print(json.dumps({"first": first, "repeat": again}))
"""


def time_labkit(world_size: int, repeats: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LABKIT_CHILD), str(world_size), str(repeats)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = ap.parse_args()
    import torch

    rows = []
    for ws in [int(w) for w in args.world_sizes.split(",")]:
        spawn = [time_spawn(ws) for _ in range(args.repeats)]
        lab = time_labkit(ws, args.repeats)
        row = {
            "world_size": ws,
            "spawn_median_s": statistics.median(spawn),
            "labkit_first_s": lab["first"],
            "labkit_repeat_median_s": statistics.median(lab["repeat"]),
        }
        row["repeat_speedup"] = row["spawn_median_s"] / row["labkit_repeat_median_s"]
        row["first_speedup"] = row["spawn_median_s"] / row["labkit_first_s"]
        rows.append(row)

    print(
        f"# launch latency — {platform.node() or 'this machine'}, {os.cpu_count()} cores, "
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"{args.repeats} repeats (medians)"
    )
    print(
        "| ranks | mp.spawn + init | lk.launch first | lk.launch repeated "
        "| spawn / repeated | spawn / first |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['world_size']} | {r['spawn_median_s']:.2f} s | {r['labkit_first_s']:.2f} s "
            f"| {r['labkit_repeat_median_s']:.3f} s | {r['repeat_speedup']:.1f}x "
            f"| {r['first_speedup']:.1f}x |"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows, "command": " ".join(sys.argv)}, indent=1))


if __name__ == "__main__":
    main()
