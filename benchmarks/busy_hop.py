"""A pipeline hop while every rank computes, against the length of the ranks' bursts.

Run:  .venv/bin/python benchmarks/busy_hop.py [--world-size 4] [--bytes 32768] [--backend gloo]

Every rank computes a burst of small matrix products, then sends ``--bytes`` to the next
rank and receives from the one before (the calibration's ``p2p_busy`` probe,
``labkit/bench_between.py``), for bursts of 40 (the calibration's), 120, 240 and 480
products. Printed per burst length: the time per burst with every rank computing, and what
the hop adds to it (median of 5 samples of 8 iterations; first rank's start to last rank's
end). With more ranks than cores, a rank woken by its message waits for a core that another
rank holds for its burst: the longer the bursts, the longer the hop.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import labkit as lk  # noqa: E402
from labkit import bench_between as bb  # noqa: E402

BURSTS = (40, 120, 240, 480)


def rank_fn(rank: int, world: int, n_bytes: int) -> dict:
    torch.set_num_threads(1)
    out = {}
    for units in BURSTS:
        burst = bb._burster(units)
        hop = bb._busy_hop(burst, torch.zeros(n_bytes // 4))
        per = bb._per_iteration({"none": burst, "hop": hop}, 8, 5)
        out[units] = (statistics.median(per["hop"]), statistics.median(per["none"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--bytes", type=int, default=32 << 10)
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args()
    lk.launcher.settle()  # the zygote's warm-up imports, before anything is timed
    got = lk.launch(rank_fn, args.world_size, backend=args.backend, args=(args.bytes,))[0]
    print(f"{args.world_size} ranks ({args.backend}), hops of {args.bytes} bytes:")
    for units, (hop, none) in got.items():
        print(f"burst of {units:3d} products: {none * 1e3:.2f} ms per burst with every rank "
              f"computing; the hop adds {(hop - none) * 1e3:.2f} ms")  # fmt: skip
    lk.shutdown()


if __name__ == "__main__":
    main()
