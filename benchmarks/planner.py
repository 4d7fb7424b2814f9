"""The planner's step time against the capstone's measured steps, every strategy, 2 and 4 ranks.

Run:  .venv/bin/python benchmarks/planner.py [--rounds 2] [--steps 8] [--backend gloo]
      [--out benchmarks/RESULTS.md]

Every number comes from this run on this machine. Each round, one after the other:

for 2 and then 4 ranks,

1. calibration: ``lk.bench.measure_probes`` (fast) and ``lk.bench.capstone_workload``
   (TinyGPT's layers, Adam and one single-process step timed on one thread; each strategy's
   own code timed on one process with torch's fake process group): notebook 21's calibration;
2. every strategy the capstone runs on that many ranks (DP, ZeRO-1/2/3,
   FSDP2, PP, TP; on 4 ranks also DP×TP, FSDP2×TP and DP×PP; dp×pp×tp needs 8 ranks), each
   trained ``--steps`` steps in one launch (``lk.capstone.run_jobs``), its median step after
   the first (the slowest rank's);
3. the calibration's probes again, right after the runs; the model is made of both
   calibrations' samples (``lk.costmodel.calibrate.pool``; medians: a training step pays
   typical calls, not the best ones), and its ``lk.planner.step_time`` is compared with each
   measured step. Beside it, the model of the calibration before the runs alone (notebook
   21's): the same measurements, one calibration.

Targets: predicted within 1.5x of measured for every strategy; the strategy predicted fastest
is measured fastest or within 10 % of the fastest.
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


from _record import machine, publish  # noqa: E402  (this folder: the script's own path)

import labkit as lk  # noqa: E402
from labkit.costmodel.calibrate import machine_from_probes, pool  # noqa: E402

cap = lk.capstone
NAMES = ("dp", "zero1", "zero2", "zero3", "fsdp", "pp", "tp", "dp_tp", "fsdp_tp", "dp_pp")
RATIO, RANK_SLACK = 1.5, 1.10
VERBOSE = "--verbose" in sys.argv


def strategies(world_size: int) -> list:
    out = []
    for name in NAMES:
        try:
            out.append(cap.Strategy.parse(name, world_size))
        except ValueError:
            continue  # a 2-D strategy on 2 ranks
    return out


def _handoff_us(probes) -> str:
    """The median hand-off round of each launch of a calibration, µs (``lk.bench.handoff``)."""
    h = probes.backends[0].handoff
    return ", ".join(f"{statistics.median(h[k][0]) * 1e6:.0f}" for k in sorted(h))


def one_round(steps: int, backend: str) -> dict:
    config = cap.RunConfig(steps=steps, eval_every=steps, max_norm=0.5, warmup_steps=1)
    out = {"calibration_s": [], "load": [], "rows": {}, "before_only": {}, "handoff": []}
    for p in (2, 4):  # calibrate right before and right after the runs: the load drifts
        t0 = time.perf_counter()
        before = lk.bench.measure_probes([backend], (2, p), fast=True)
        ss = strategies(p)
        work = lk.bench.capstone_workload(config, strategies=ss)
        out["calibration_s"].append(time.perf_counter() - t0)
        out["load"].append(os.getloadavg()[0])
        runs = cap.run_jobs([(s, config) for s in ss], backend=backend, device="cpu", timeout=1800)
        after = lk.bench.measure_probes([backend], (2, p), fast=True)
        machine = machine_from_probes(pool(before, after), "median")
        first = machine_from_probes(before, "median")  # notebook 21's: one calibration before
        out["handoff"].append((p, _handoff_us(before), _handoff_us(after)))
        for s, ranks in zip(ss, runs, strict=True):
            measured = statistics.median(ranks[0]["step_s"][1:])
            args = (s.dims, s.zero_stage, s.fsdp, s.microbatches)
            st = lk.planner.step_time(work, machine, backend, *args)
            out["rows"][(p, s.name)] = (st.step_s, measured)
            alone = lk.planner.step_time(work, first, backend, *args).step_s
            out["before_only"][(p, s.name)] = measured / alone
            if VERBOSE:
                print(f"{p} ranks {s.name}: measured {measured * 1e3:.1f} ms", *st.reasons,
                      sep="\n    ")  # fmt: skip
    return out


def report(rounds: list[dict], args, load: list[float]) -> str:
    cmd = ".venv/bin/python benchmarks/planner.py " + " ".join(sys.argv[1:])
    lines = [
        "## The planner's step time against the capstone, every strategy",
        "",
        f"{machine()}, backend {args.backend}; TinyGPT (dim 64, 4 layers, "
        f"4 heads, T 32, batch 16), {args.steps} steps per strategy (median after the first); "
        f"{len(rounds)} round(s); before the 2-rank and the 4-rank runs of each round a "
        "calibration, and the calibration's probes again after them ("
        + ", ".join(f"{t:.1f} s" for r in rounds for t in r["calibration_s"])
        + f"); 1-minute load average {load[0]:.1f} before, "
        + ", ".join(f"{x:.1f}" for r in rounds for x in r["load"])
        + f" after each first calibration, {load[1]:.1f} at the end. Command:",
        "",
        "```",
        cmd.rstrip(),
        "```",
        "",
        "Predicted / measured step in ms and measured / predicted, per round (after the "
        "semicolon: measured / predicted by the calibration before the runs alone):",
        "",
        "| ranks | strategy | "
        + " | ".join(f"round {i + 1}" for i in range(len(rounds)))
        + " | measured, last round / first |",
        "|---|---|" + "---|" * (len(rounds) + 1),
    ]
    within, total, ranking = 0, 0, []
    first_only = [sum(1 / RATIO <= v <= RATIO for v in r["before_only"].values()) for r in rounds]
    for p in (2, 4):
        for name in [n for n in NAMES if (p, n) in rounds[0]["rows"]]:
            cells = []
            for r in rounds:
                pred, meas = r["rows"][(p, name)]
                ratio = meas / pred
                total += 1
                within += 1 / RATIO <= ratio <= RATIO
                alone = r["before_only"][(p, name)]
                cells.append(f"{pred * 1e3:.1f} / {meas * 1e3:.1f} ({ratio:.2f}; {alone:.2f})")
            drift = rounds[-1]["rows"][(p, name)][1] / rounds[0]["rows"][(p, name)][1]
            lines.append(f"| {p} | {name} | " + " | ".join(cells) + f" | {drift:.2f} |")
        for i, r in enumerate(rounds):
            rows = {n: v for (q, n), v in r["rows"].items() if q == p}
            first = min(rows, key=lambda n: rows[n][0])
            fastest = min(rows, key=lambda n: rows[n][1])
            slack = rows[first][1] / rows[fastest][1]
            ranking.append(
                f"{p} ranks, round {i + 1}: predicted first {first}, measured fastest {fastest}"
                f" ({'the same' if first == fastest else f'{first} is {slack:.2f}x it'})"
                f" — {'met' if slack <= RANK_SLACK else 'missed'}"
            )
    lines += [
        "",
        f"Within {RATIO}x: {within} of {total} (per round "
        + ", ".join(
            str(sum(1 / RATIO <= m / p_ <= RATIO for p_, m in r["rows"].values())) for r in rounds
        )
        + "; with the calibration before the runs alone, per round "
        + ", ".join(str(k) for k in first_only)
        + f"). Ranking (target: the strategy predicted first "
        f"is measured fastest or within {RANK_SLACK - 1:.0%} of it):",
        "",
        *[f"- {line}" for line in ranking],
        "",
        "The hand-off between ranks 0 and 1 (1 MiB there and back, µs; the calibration's last "
        "probe, in its 2-rank launch and then its p-rank one), in the calibration before the "
        "runs → after them:",
        "",
        *[
            f"- round {i + 1}, {p} ranks: {b} → {a}"
            for i, r in enumerate(rounds)
            for p, b, a in r["handoff"]
        ],
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="calibrate + measure, this often")
    parser.add_argument("--steps", type=int, default=8, help="training steps per strategy")
    parser.add_argument("--backend", default="gloo", help="gloo or labkit_shm")
    parser.add_argument("--out", help="append the markdown section to this file")
    parser.add_argument("--verbose", action="store_true", help="print every prediction's terms")
    args = parser.parse_args()
    load = [os.getloadavg()[0]]
    rounds = [one_round(args.steps, args.backend) for _ in range(args.rounds)]
    load.append(os.getloadavg()[0])
    text = report(rounds, args, load)
    publish(text, args.out)
    lk.shutdown()


if __name__ == "__main__":
    main()
