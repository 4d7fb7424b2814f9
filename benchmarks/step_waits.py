"""Where a capstone step's time goes: inside its collectives and its pipeline receives.

Run:  .venv/bin/python benchmarks/step_waits.py tp 2 [--steps 8] [--backend gloo]
      (any capstone strategy name and its world size: dp, tp, pp, dp_tp, dp_pp, ...)

Each rank builds the strategy as the capstone does (``lk.capstone.train.build_rank``), wraps
``dist.all_reduce`` and the pipeline's receives (``Exchange._issue``, which waits for its
messages) with timers, and trains ``--steps`` steps. Per rank and step it prints the step,
the seconds spent inside those calls (waiting for peers included), and the calls by size —
the measurement the planner's per-call prices are compared with (benchmarks/RESULTS.md,
"The planner's step time against the capstone") — and the CPU time the rank's process used
(all its threads: gloo's included). Over the steps after the first, it prints how the
machine's cores spent that time (``/proc/stat``: user, system, idle; Linux only).
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import labkit as lk  # noqa: E402
from labkit.parallel.pipeline import p2p  # noqa: E402


def rank_fn(rank: int, world: int, name: str, steps: int) -> list:
    from labkit.capstone.config import global_batch
    from labkit.capstone.train import build_rank, train_step
    from labkit.data import char_corpus
    from labkit.mesh import dp_shard

    s = lk.capstone.Strategy.parse(name, world)
    c = lk.capstone.RunConfig(steps=steps, eval_every=steps, max_norm=0.5, warmup_steps=1)
    corpus = char_corpus()
    mesh, parts, opt, schedule, context = build_rank(s, c, torch.device("cpu"), corpus.vocab_size)
    seen: dict = {}
    all_reduce, issue = dist.all_reduce, p2p.Exchange._issue

    def add(key: tuple, t0: float) -> None:
        n, t = seen.get(key, (0, 0.0))
        seen[key] = (n + 1, t + time.perf_counter() - t0)

    def timed_all_reduce(t, *args, **kwargs):
        t0 = time.perf_counter()
        out = all_reduce(t, *args, **kwargs)
        add(("all_reduce", t.numel() * t.element_size()), t0)
        return out

    def timed_issue(self, recvs):
        t0 = time.perf_counter()
        issue(self, recvs)
        add(("recv", 0), t0)

    dist.all_reduce, p2p.Exchange._issue = timed_all_reduce, timed_issue
    rows, cores = [], []
    try:
        for k in range(steps):
            x, y = (dp_shard(t, s.dims, mesh) for t in global_batch(corpus, c, k))
            dist.barrier()
            if k == 1:
                cores.append(_cpu_ticks())
            seen.clear()
            t0, c0 = time.perf_counter(), time.process_time()
            train_step(parts, opt, schedule, x, y, c, 1, context)
            rows.append((time.perf_counter() - t0, dict(seen), time.process_time() - c0))
        cores.append(_cpu_ticks())
    finally:
        dist.all_reduce, p2p.Exchange._issue = all_reduce, issue
    return [rows, cores]


def _cpu_ticks() -> list[int]:
    """The machine's CPU time so far by kind (``/proc/stat``'s first line), [] elsewhere."""
    with suppress(OSError), open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:]]
    return []


def cores_line(before: list[int], after: list[int]) -> str:
    """How the cores spent the steps: user, system (irq included), idle (iowait included)."""
    if not before or not after:
        return "the cores' time: no /proc/stat here"
    d = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(d[:8])  # user nice system idle iowait irq softirq steal
    user, system, idle = d[0] + d[1], d[2] + d[5] + d[6], d[3] + d[4]
    return (
        f"the cores, over those steps (every rank's barriers included): user {user / total:.0%}, "
        f"system {system / total:.0%}, idle {idle / total:.0%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("strategy")
    parser.add_argument("world_size", type=int)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args()
    lk.launcher.settle()  # the zygote's warm-up imports, before anything is timed
    ranks = lk.launch(
        rank_fn, args.world_size, backend=args.backend, args=(args.strategy, args.steps)
    )
    print(f"{args.strategy} on {args.world_size} ranks ({args.backend}), steps after the first:")
    for r, (rows, _) in enumerate(ranks):
        for step_s, seen, cpu_s in rows[1:]:
            inside = sum(t for _, t in seen.values())
            calls = ", ".join(
                f"{op} {n} B: {c} calls {t * 1e3:.1f} ms" if op != "recv" else
                f"receives: {c} waits {t * 1e3:.1f} ms"
                for (op, n), (c, t) in sorted(seen.items())
            )  # fmt: skip
            print(
                f"rank {r}: step {step_s * 1e3:.1f} ms, {inside * 1e3:.1f} ms inside ({calls}); "
                f"CPU {cpu_s * 1e3:.1f} ms"
            )
    print(cores_line(*ranks[0][1]) if len(ranks[0][1]) == 2 else "too few steps for the cores")
    lk.shutdown()


if __name__ == "__main__":
    main()
