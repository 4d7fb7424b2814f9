"""A pair's all-reduce inside 4 ranks: the calibration's two prices of it against the step's.

Run:  .venv/bin/python benchmarks/pair_calls.py [--rounds 3] [--steps 6] [--backend gloo]

In one launch of 4 ranks, each round runs the calibration's probe of calls between bursts
of compute (``lk.bench_between.sized``: both pairs calling at once, in step) and then
``--steps`` steps of the capstone's DP×TP (dp 2 × tp 2: its tensor-parallel all-reduces are
on pairs), every ``dist.all_reduce`` of the step's activations (256 tokens × 64 × 4 bytes =
64 KB) timed. Printed per round, at 64 KB (the probe's 32 and 128 KB, log-linearly):

- **wall**: what the call adds to a burst of compute with both pairs in step (per burst with
  it, less per burst without; first rank's start to last rank's end) — the planner's price
  of a pair's call after backward;
- **CPU × turns**: the CPU time a rank's process spends in the call (every thread's), times
  the ranks taking turns on a core (4 ranks on ``cores``) — its price inside forward and
  backward when more ranks than cores share the machine (``labkit/plan_time.py``);
- **in the step**: the median time a rank spent inside one such all-reduce of a step
  (its peer's lateness included), and the step's median.

The step is CPU-bound on fewer cores than ranks: a pair's call there costs the step the CPU
it takes, while the other pair computes through its waits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import labkit as lk  # noqa: E402
from labkit import bench_between as bb  # noqa: E402
from labkit.bench_calibrate import _cores  # noqa: E402
from labkit.costmodel.machine import _interp  # noqa: E402

SIZE = 1 << 16  # a DP×TP step's activations on 4 ranks: 256 tokens × 64 × 4 bytes
WORLD = 4


def _at_size(table: dict[int, float]) -> float:
    """Log-linear between the probe's sizes (32 and 128 KB), at ``SIZE``, as the model reads
    its tables."""
    return _interp(table, SIZE)


def rank_fn(rank: int, world: int, rounds: int, steps: int) -> list[dict]:
    from labkit.capstone.config import global_batch
    from labkit.capstone.train import build_rank, train_step
    from labkit.data import char_corpus
    from labkit.mesh import dp_shard

    torch.set_num_threads(1)
    s = lk.capstone.Strategy.parse("dp_tp", world)
    c = lk.capstone.RunConfig(steps=steps, eval_every=steps, max_norm=0.5, warmup_steps=1)
    corpus = char_corpus()
    mesh, parts, opt, schedule, context = build_rank(s, c, torch.device("cpu"), corpus.vocab_size)
    all_reduce, inside = dist.all_reduce, []

    def timed(t, *args, **kwargs):
        t0 = time.perf_counter()
        out = all_reduce(t, *args, **kwargs)
        if t.numel() * t.element_size() == SIZE:
            inside.append(time.perf_counter() - t0)
        return out

    out = []
    for _ in range(rounds):
        wall, cpu = bb.sized(8, 5)
        pick = statistics.median
        row = {
            "wall": {n: pick(w) - pick(wo) for (op, n, q), (w, wo) in wall.items()
                     if op == "all_reduce" and q == 2},
            "cpu": {n: pick(w) - pick(wo) for (op, n, q), (w, wo) in cpu.items()
                    if op == "all_reduce"},
            "calls": [], "steps": [],
        }  # fmt: skip
        dist.all_reduce = timed
        try:
            for k in range(steps):
                x, y = (dp_shard(t, s.dims, mesh) for t in global_batch(corpus, c, k))
                dist.barrier()
                inside.clear()
                t0 = time.perf_counter()
                train_step(parts, opt, schedule, x, y, c, 1, context)
                if k:  # the first step warms up
                    row["steps"].append(time.perf_counter() - t0)
                    row["calls"].append(statistics.median(inside))
        finally:
            dist.all_reduce = all_reduce
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args()
    lk.launcher.settle()
    ranks = lk.launch(rank_fn, WORLD, backend=args.backend, args=(args.rounds, args.steps))
    cores = _cores()  # as the calibration counts them
    turns = max(1.0, WORLD / cores)
    print(f"an all-reduce of {SIZE >> 10} KB on pairs inside {WORLD} ranks ({args.backend}, "
          f"{cores} cores: ×{turns:g} turns), ms:")  # fmt: skip
    for i, row in enumerate(ranks[0]):
        calls = [t for r in ranks for t in r[i]["calls"]]  # every rank's per-step medians
        print(
            f"round {i + 1}: wall {_at_size(row['wall']) * 1e3:.2f}, "
            f"CPU × turns {_at_size(row['cpu']) * turns * 1e3:.2f} "
            f"(CPU {_at_size(row['cpu']) * 1e3:.2f}), "
            f"in the step {statistics.median(calls) * 1e3:.2f} "
            f"(step {statistics.median(row['steps']) * 1e3:.1f})"
        )
    lk.shutdown()


if __name__ == "__main__":
    main()
