"""labkit_shm's speed against the hand-off between the two cores, second by second.

Run:  .venv/bin/python benchmarks/handoff.py [--blocks 60] [--size 4194304] [--launches 3]

One launch of 2 ranks on labkit_shm after another; in each, ``--blocks`` times over: the
hand-off (rank 0 writes 1 MiB into shared memory, rank 1 copies it out, and rank 0 sees it
done; and one copy of 1 MiB between private buffers: ``labkit/bench_handoff.py``), then
labkit_shm's all_reduce of ``--size`` bytes and gloo's (a gloo group over the same two
ranks), fastest of 10 each, a barrier before each call. Printed per window of ``--window``
seconds (0: per block): the seconds since the start, the blocks, and the median of the two
copies and the two all-reduces over its blocks; then how closely each all-reduce follows the
hand-off across blocks (Pearson's r), and the median of each column in the blocks whose
hand-off took at most 1.5x the run's median and in the others.

On a virtual machine the host decides where the virtual CPUs run; where the two cores stop
sharing a cache, every chunk labkit_shm hands over comes from the other core's cache, and the
calibration (private copies, measured moments before) cannot know.
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
from _record import machine  # noqa: E402  (this folder: the script's own path)

import labkit as lk  # noqa: E402
from labkit.bench_handoff import handoff  # noqa: E402


def _fastest(t: torch.Tensor, group, reps: int = 10) -> float:
    times = []
    for _ in range(reps):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(t, group=group)
        times.append(time.perf_counter() - t0)
    return min(times)


def rank_fn(rank: int, world: int, blocks: int, size: int, t0: float) -> list[tuple]:
    torch.set_num_threads(1)
    gloo = dist.new_group(backend="gloo")
    t = torch.ones(size // 4)
    for g in (None, gloo):
        _fastest(t, g, 3)  # warm both
    rows = []
    for _ in range(blocks):
        h = handoff(1 << 20, 20)
        shm, gl = _fastest(t, None), _fastest(t, gloo)
        if rank == 0:
            rounds, private = statistics.median(h["round_s"]), statistics.median(h["private_s"])
            rows.append((time.time() - t0, rounds, private, shm, gl))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=60, help="blocks per launch")
    parser.add_argument("--size", type=int, default=4 << 20, help="all_reduce bytes")
    parser.add_argument("--launches", type=int, default=3, help="launches, one after another")
    parser.add_argument("--window", type=float, default=5.0, help="seconds per printed line")
    args = parser.parse_args()
    lk.launcher.settle()
    print(machine())
    print(".venv/bin/python benchmarks/handoff.py " + " ".join(sys.argv[1:]))
    print("   s  blocks  hand-off µs  private µs  labkit_shm ms  gloo ms  (1 MiB; all_reduce "
          f"of {args.size} bytes, fastest of 10; medians per line)")  # fmt: skip
    t0, rows = time.time(), []
    for _ in range(args.launches):
        rows += lk.launch(rank_fn, 2, backend="labkit_shm", args=(args.blocks, args.size, t0))[0]
    windows: dict[float, list] = {}
    for r in rows:
        start = r[0] // args.window * args.window if args.window > 0 else r[0]
        windows.setdefault(start, []).append(r)
    for start, part in windows.items():
        h, p, shm, gl = (statistics.median(r[i] for r in part) for i in range(1, 5))
        print(f"{start:4.0f}  {len(part):6d}  {h * 1e6:11.0f}  {p * 1e6:10.0f}  "
              f"{shm * 1e3:13.2f}  {gl * 1e3:7.2f}")  # fmt: skip
    hand = [r[1] for r in rows]
    if len(set(hand)) > 1:
        r_shm, r_gloo = (statistics.correlation(hand, [r[i] for r in rows]) for i in (3, 4))
        print(f"Pearson's r with the hand-off over {len(rows)} blocks: labkit_shm {r_shm:.2f}, "
              f"gloo {r_gloo:.2f}")  # fmt: skip
    usual = statistics.median(hand)
    for label, part in (
        ("hand-off within 1.5x of its median", [r for r in rows if r[1] <= 1.5 * usual]),
        ("hand-off slower", [r for r in rows if r[1] > 1.5 * usual]),
    ):
        if not part:
            print(f"{label}: no blocks")
            continue
        med = [statistics.median(r[i] for r in part) for i in range(1, 5)]
        print(
            f"{label}: {len(part)} blocks; medians: hand-off {med[0] * 1e6:.0f} µs, private "
            f"{med[1] * 1e6:.0f} µs, labkit_shm {med[2] * 1e3:.2f} ms, gloo {med[3] * 1e3:.2f} ms "
            f"(gloo / labkit_shm {med[3] / med[2]:.1f}x)"
        )
    lk.shutdown()


if __name__ == "__main__":
    main()
