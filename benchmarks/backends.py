"""Backends side by side: gloo and labkit_shm all-reduce, against memcpy and the cost model.

Run:  .venv/bin/python benchmarks/backends.py [--world-sizes 2,4] [--iters 20] [--rounds 2]
      [--out benchmarks/RESULTS.md]

Every number comes from this run on this machine; the machine is noisy, so read the ratios.
For each world size and backend, ``lk.bench.collective("all_reduce", ...)`` times float32
all-reduces from 8 B to 16 MB (a sample is the slowest rank's time after a barrier; the
median over samples is reported). The backends take turns, ``--rounds`` times, and the samples
of all rounds are pooled, so a slow minute of the machine hits both. Reported:

- busbw at 16 MB (nccl-tests' definition: algbw · 2(p−1)/p) and the 8-byte latency, per
  backend, and labkit_shm / gloo ratios;
- the machine's single-core memcpy bandwidth measured in the same run (``torch`` copy of
  16 MB and 64 MB buffers, one thread; bytes copied per second), and each busbw as a
  fraction of it;
- how well the α-β model fitted on point-to-point times only (``lk.bench.p2p_pingpong`` on 2
  ranks, ``lk.costmodel.fit``) predicts the all-reduce time (ring, Thakur, Rabenseifner and
  Gropp 2005): the median relative error |predicted − measured| / measured over sizes ≥ 64 KB;
- the targets: labkit_shm's 16 MB busbw at least 5x gloo's with 2 ranks, 4x with 4;
- the hand-off between two cores before and after each all-reduce launch (``lk.bench.handoff``):
  where the host runs the two virtual CPUs, which moves labkit_shm's time more than gloo's;
- what bounds labkit_shm: the memory work of its all-reduce alone (its copies and reduction
  passes, ``lk.costmodel.recipes``, priced at the rates ``lk.bench.measure_probes`` measures
  while every rank copies at once — a rank per core, or two), against its measured time and
  gloo's: gloo's time over that work is the largest busbw ratio any synchronisation could give.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from _record import machine, publish  # noqa: E402  (this folder: the script's own path)

import labkit as lk  # noqa: E402

BACKENDS = ("gloo", "labkit_shm")
SIZES = [8, 1 << 10, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24]  # bytes
P2P_SIZES = [8, 1 << 10, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24]
BIG = 1 << 24
FIT_FROM = 1 << 16  # the model's error is taken over sizes >= 64 KB
TARGET = {2: 5.0, 4: 4.0}  # labkit_shm / gloo, 16 MB busbw


def memcpy_gbps(n_bytes: int, repeats: int = 15) -> float:
    """Single-core copy bandwidth: bytes copied per second (median), ``dst.copy_(src)``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(n_bytes, dtype=torch.uint8)
        dst = torch.empty_like(src)
        dst.copy_(src)  # touch the pages
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return n_bytes / statistics.median(times) / 1e9


def _pool(runs: list[list]) -> list:
    """Rows of several runs of the same sizes, with their samples pooled (median recomputed)."""
    pooled = []
    for rows in zip(*runs, strict=True):
        samples = tuple(t for r in rows for t in r.times_s)
        t = statistics.median(samples)
        r0 = rows[0]
        scale = r0.busbw_gbps / r0.algbw_gbps if r0.algbw_gbps else 1.0
        pooled.append(
            replace(
                r0,
                time_s=t,
                algbw_gbps=r0.n_bytes / t / 1e9,
                busbw_gbps=r0.n_bytes / t / 1e9 * scale,
                iters=len(samples),
                times_s=samples,
            )
        )
    return pooled


def _allreduce(rank: int, world_size: int, sizes: list[int], iters: int) -> tuple:
    """The rows, and the hand-off between ranks 0 and 1 before and after them (µs)."""
    before = lk.bench.handoff()
    rows = lk.bench.collective("all_reduce", sizes, iters=iters, warmup=3)
    after = lk.bench.handoff()
    hand = [h and statistics.median(h["round_s"]) * 1e6 for h in (before, after)]
    return rows, hand


def _pingpong(rank: int, world_size: int, sizes: list[int], iters: int) -> list:
    return lk.bench.p2p_pingpong(sizes, iters=iters, warmup=3)


def measure(world_sizes: list[int], iters: int, rounds: int) -> tuple[dict, dict]:
    """All-reduce rows per (backend, world size) and p2p rows per backend, rounds pooled; and
    the hand-off before and after each all-reduce launch, µs, per (backend, world size)."""
    runs: dict = {}
    hands: dict = {}
    for _ in range(rounds):
        for backend in BACKENDS:
            key = (backend, "p2p")
            rows = lk.launch(_pingpong, 2, backend=backend, args=(P2P_SIZES, iters), timeout=600)
            runs.setdefault(key, []).append(rows[0])
            for p in world_sizes:
                rows, hand = lk.launch(
                    _allreduce, p, backend=backend, args=(SIZES, iters), timeout=600
                )[0]
                runs.setdefault((backend, p), []).append(rows)
                hands.setdefault((backend, p), []).append(hand)
    return {key: _pool(r) for key, r in runs.items()}, hands


def model_error(p2p_rows: list, ar_rows: list, stat: str) -> tuple[lk.Network, float, float]:
    """Fit α, β on p2p rows; median |pred − meas| / meas and meas / pred of rows >= 64 KB."""

    def pick(r):
        return r.time_s if stat == "median" else r.time_min_s

    net = lk.costmodel.fit([r.n_bytes for r in p2p_rows], [pick(r) for r in p2p_rows])
    errors, ratios = [], []
    for r in ar_rows:
        if r.n_bytes >= FIT_FROM:
            pred = lk.costmodel.predict("all_reduce", r.n_bytes, r.world_size, net, "ring")
            errors.append(abs(pred - pick(r)) / pick(r))
            ratios.append(pick(r) / pred)
    return net, statistics.median(errors), statistics.median(ratios)


def bound_lines(results: dict, world_sizes: list[int], model) -> list[str]:
    """labkit_shm's 16 MB time against the memory work of its algorithm alone, and gloo's."""
    lines = [
        "",
        "16 MB all-reduce against labkit_shm's own memory work (its copies and reduction "
        "passes at the rates measured while every rank copies at once; fastest samples, "
        "ms), and the targets (labkit_shm / gloo busbw, medians / fastest):",
        "",
        "| ranks | labkit_shm | its memory work | labkit_shm / work | gloo | gloo / work "
        "(the ceiling) | busbw ratio | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in world_sizes:
        s = {r.n_bytes: r for r in results[("labkit_shm", p)]}[BIG]
        g = {r.n_bytes: r for r in results[("gloo", p)]}[BIG]
        terms = lk.costmodel.collective_terms(model, "labkit_shm", "all_reduce", BIG, p)
        work = terms["copy"] + terms["reduce"]
        ratio = (g.time_s / s.time_s, g.time_min_s / s.time_min_s)
        met = "met" if ratio[0] >= TARGET[p] else "missed"
        lines.append(
            f"| {p} | {s.time_min_s * 1e3:.2f} | {work * 1e3:.2f} | {s.time_min_s / work:.2f} | "
            f"{g.time_min_s * 1e3:.2f} | {g.time_min_s / work:.2f} | {ratio[0]:.2f} / "
            f"{ratio[1]:.2f} | ≥ {TARGET[p]:g}: {met} |"
        )
    return lines


def report(
    results: dict,
    hands: dict,
    world_sizes: list[int],
    copy: dict[int, float],
    load: list[float],
    args,
    model=None,
) -> str:
    cmd = ".venv/bin/python benchmarks/backends.py " + " ".join(sys.argv[1:])
    lines = [
        "## Backends: gloo vs labkit_shm all-reduce, memcpy, and the p2p-fitted cost model",
        "",
        f"{machine()}, {args.iters} samples × {args.rounds} rounds per point; "
        f"1-minute load average {load[0]:.1f} before and {load[1]:.1f} after (other users' "
        "processes share the cores). Command:",
        "",
        "```",
        cmd.rstrip(),
        "```",
        "",
        "Single-core memcpy in the same run: "
        + ", ".join(f"{n >> 20} MB {bw:.2f} GB/s" for n, bw in copy.items())
        + f". busbw fractions below are of the 16 MB copy ({copy[BIG]:.2f} GB/s).",
        "",
        "Each cell: median of the pooled samples, then (after the slash) the fastest sample — "
        "the machine's best case, which other processes' scheduling delays cannot inflate.",
        "",
        "| ranks | backend | 8 B latency (µs) | 16 MB busbw (GB/s) | busbw / memcpy |",
        "|---|---|---|---|---|",
    ]

    def best_busbw(r) -> float:
        return r.busbw_gbps * r.time_s / r.time_min_s

    for p in world_sizes:
        for b in BACKENDS:
            rows = {r.n_bytes: r for r in results[(b, p)]}
            small, big = rows[8], rows[BIG]
            lines.append(
                f"| {p} | {b} | {small.time_s * 1e6:.0f} / {small.time_min_s * 1e6:.0f} | "
                f"{big.busbw_gbps:.3f} / {best_busbw(big):.3f} | "
                f"{big.busbw_gbps / copy[BIG]:.3f} / {best_busbw(big) / copy[BIG]:.3f} |"
            )
    lines += [
        "",
        "| ranks | 8 B latency, labkit_shm / gloo | 16 MB busbw, labkit_shm / gloo |",
        "|---|---|---|",
    ]
    for p in world_sizes:
        g = {r.n_bytes: r for r in results[("gloo", p)]}
        s = {r.n_bytes: r for r in results[("labkit_shm", p)]}
        lat = (s[8].time_s / g[8].time_s, s[8].time_min_s / g[8].time_min_s)
        bus = (s[BIG].busbw_gbps / g[BIG].busbw_gbps, best_busbw(s[BIG]) / best_busbw(g[BIG]))
        lines.append(f"| {p} | {lat[0]:.2f} / {lat[1]:.2f} | {bus[0]:.2f} / {bus[1]:.2f} |")
    lines += [
        "",
        "The hand-off between ranks 0 and 1 before and after each all-reduce launch (µs, "
        "`lk.bench.handoff`: 1 MiB there and back; about 100 on this machine while the host "
        "keeps the two cores close, about 500 when not — `benchmarks/handoff.py`), per round: "
        + "; ".join(
            f"{b} {p} ranks " + ", ".join(f"{x:.0f} → {y:.0f}" for x, y in hands.get((b, p), []))
            for p in world_sizes
            for b in BACKENDS
        )
        + ".",
    ]
    if model is not None:
        lines += bound_lines(results, world_sizes, model)
    lines += [
        "",
        "Cost model fitted on 2-rank ping-pong only (`lk.costmodel.fit`), predicting the ring "
        "all-reduce; median relative error |predicted − measured| / measured over sizes "
        "≥ 64 KB, fitting and comparing medians (and, second, the fastest samples):",
        "",
        "| backend | fitted α (µs) | fitted 1/β (GB/s) | ranks | error (medians) | "
        "measured / predicted | error (fastest) |",
        "|---|---|---|---|---|---|---|",
    ]
    for b in BACKENDS:
        for p in world_sizes:
            net, err, ratio = model_error(results[(b, "p2p")], results[(b, p)], "median")
            _, err_min, _ = model_error(results[(b, "p2p")], results[(b, p)], "min")
            lines.append(
                f"| {b} | {net.latency_us:.1f} | {net.bandwidth_gbps:.2f} | {p} | "
                f"{err:.0%} | {ratio:.2f} | {err_min:.0%} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="2,4", help="comma-separated, e.g. 2,4")
    parser.add_argument("--iters", type=int, default=20, help="timed samples per size and run")
    parser.add_argument("--rounds", type=int, default=2, help="turns each backend takes")
    parser.add_argument("--out", help="append the markdown section to this file")
    args = parser.parse_args()
    lk.launcher.settle()  # the zygote's warm-up imports, before anything is timed
    world_sizes = [int(w) for w in args.world_sizes.split(",")]
    load = [os.getloadavg()[0]]
    copy = {n: memcpy_gbps(n) for n in (BIG, 4 * BIG)}
    results, hands = measure(world_sizes, args.iters, args.rounds)
    probes = lk.bench.measure_probes(BACKENDS, world_sizes, fast=True)
    model = lk.costmodel.calibrate.machine_from_probes(probes, "min")
    load.append(os.getloadavg()[0])
    copy_after = {n: memcpy_gbps(n) for n in copy}  # before and after: the machine drifts
    copy = {n: (copy[n] + copy_after[n]) / 2 for n in copy}
    for (backend, p), rows in results.items():
        print(f"# {backend}, {'2 ranks, p2p' if p == 'p2p' else f'{p} ranks, all_reduce'}")
        print(lk.bench.format_table(rows))
    text = report(results, hands, world_sizes, copy, load, args, model)
    publish(text, args.out)
    lk.shutdown()


if __name__ == "__main__":
    main()
