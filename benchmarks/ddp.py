"""DDP step time: DataParallelNaive, DataParallelBucketed and PyTorch DDP, as ratios.

Run:  .venv/bin/python benchmarks/ddp.py [--world-sizes 2,4] [--params 5000000] [--layers 8]
      [--iters 40] [--cap-mb 25] [--simnet-cap-mb 4] [--out benchmarks/RESULTS.md]

Every number comes from this run on this machine; the machine is noisy, so read the ratios.
One training step (zero_grad, forward, backward, SGD step) of
``lk.models.mlp_with_parameters(--params)`` on a batch of ``--batch`` digits-shaped inputs per
rank, timed per rank after a barrier; a sample is the slowest rank's step. The wrappers live
side by side in the same ranks and take turns step by step, so a slow minute of the machine
hits all of them. Medians are reported.

- gloo and ``labkit_shm``: naive (one blocking all-reduce per parameter after backward),
  bucketed (``bucket_cap_mb=--cap-mb``, reduced during backward) and
  ``torch.nn.parallel.DistributedDataParallel`` (same ``bucket_cap_mb``; default 25, PyTorch's
  default); ratios to PyTorch DDP's step time.
- The simulated 10 GbE network (``lk.backends.simnet.spec("10GbE")`` over ``--simnet-inner``,
  default gloo), with ``--simnet-cap-mb`` buckets: naive, bucketed with ``overlap=True`` vs
  ``overlap=False`` (same buckets, reduced one after the other after backward) and PyTorch
  DDP; the step time saved by overlapping, and the model's all-reduce time for the whole
  gradient (``lk.costmodel.predict``) for scale.
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
from _record import machine, publish  # noqa: E402  (this folder: the script's own path)

import labkit as lk  # noqa: E402

BACKENDS = ("gloo", "labkit_shm")
IMPLS = ("naive", "bucketed", "torch")
SIMNET_IMPLS = ("naive", "overlap", "no_overlap", "torch")
BASELINE = "torch"


def _wrap(impl: str, model: torch.nn.Module, cap_mb: float) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    if impl == "naive":
        return lk.parallel.ddp.DataParallelNaive(model)
    if impl in ("bucketed", "overlap", "no_overlap"):
        return lk.parallel.ddp.DataParallelBucketed(
            model, bucket_cap_mb=cap_mb, overlap=impl != "no_overlap"
        )
    return DistributedDataParallel(model, bucket_cap_mb=cap_mb)


def _steps(
    rank: int,
    world_size: int,
    impls: tuple[str, ...],
    n_params: int,
    n_layers: int,
    batch: int,
    iters: int,
    warmup: int,
    cap_mb: float,
) -> dict[str, list[float]]:
    """This rank's step times (s) per implementation; the implementations take turns."""
    import torch.distributed as dist
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(rank)
    x, y = torch.rand(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)
    wrapped, opts = {}, {}
    for impl in impls:
        wrapped[impl] = _wrap(impl, lk.models.mlp_with_parameters(n_params, n_layers), cap_mb)
        opts[impl] = torch.optim.SGD(wrapped[impl].parameters(), lr=1e-3)
    times: dict[str, list[float]] = {impl: [] for impl in impls}
    for i in range(warmup + iters):
        for impl in impls:  # one step each in turn: a slow moment of the machine hits all
            model, opt = wrapped[impl], opts[impl]
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if i >= warmup:
                times[impl].append(time.perf_counter() - t0)
    return times


def measure(
    backend, world_size: int, impls: tuple[str, ...], cap_mb: float, args
) -> dict[str, list[float]]:
    """Per implementation, each sample the slowest rank's step time."""
    per_rank = lk.launch(
        _steps,
        world_size,
        backend=backend,
        args=(impls, args.params, args.layers, args.batch, args.iters, args.warmup, cap_mb),
        timeout=1200,
    )
    return {
        impl: [max(ts) for ts in zip(*(r[impl] for r in per_rank), strict=True)] for impl in impls
    }


def _table(title: str, samples: dict[str, list[float]], baseline: str) -> list[str]:
    base = statistics.median(samples[baseline])
    lines = [
        f"| {title} | median step (ms) | fastest (ms) | / {baseline} (median) |",
        "|---|---|---|---|",
    ]
    for impl, ts in samples.items():
        med = statistics.median(ts)
        lines.append(f"| {impl} | {med * 1e3:.1f} | {min(ts) * 1e3:.1f} | {med / base:.2f}x |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="2", help="comma-separated, e.g. 2,4")
    parser.add_argument("--params", type=int, default=5_000_000, help="model parameters (min)")
    parser.add_argument("--layers", type=int, default=8, help="hidden layers of the MLP")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--iters", type=int, default=40, help="timed steps per wrapper")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per wrapper")
    parser.add_argument("--cap-mb", type=float, default=25.0, help="bucket_cap_mb (all)")
    parser.add_argument(
        "--simnet-cap-mb", type=float, default=4.0, help="bucket_cap_mb on the 10 GbE network"
    )
    parser.add_argument(
        "--simnet-inner", default="gloo", help="backend under the simulated network"
    )
    parser.add_argument("--skip-simnet", action="store_true", help="no 10 GbE simulation")
    parser.add_argument("--out", help="append the markdown section to this file")
    args = parser.parse_args()
    lk.launcher.settle()  # the zygote's warm-up imports, before anything is timed
    world_sizes = [int(w) for w in args.world_sizes.split(",")]
    model = lk.models.mlp_with_parameters(args.params, args.layers)
    n_params = lk.models.count_parameters(model)
    grad_bytes = 4 * n_params
    load = [os.getloadavg()[0]]
    results: dict = {}
    for p in world_sizes:
        for backend in BACKENDS:
            results[(backend, p)] = measure(backend, p, IMPLS, args.cap_mb, args)
        if not args.skip_simnet:
            spec = lk.backends.simnet.spec("10GbE", inner=args.simnet_inner)
            results[("simnet", p)] = measure(spec, p, SIMNET_IMPLS, args.simnet_cap_mb, args)
    load.append(os.getloadavg()[0])

    cmd = ".venv/bin/python benchmarks/ddp.py " + " ".join(sys.argv[1:])
    lines = [
        "## DDP step time: DataParallelNaive, DataParallelBucketed, PyTorch DDP",
        "",
        f"{machine()}; `lk.models.mlp_with_parameters({args.params:_}, "
        f"n_layers={args.layers})` = {n_params:,} parameters in "
        f"{len(list(model.parameters()))} tensors ({grad_bytes / 2**20:.1f} MiB of float32 "
        "gradients), "
        f"batch {args.batch} per rank, bucket_cap_mb={args.cap_mb:g} (on the simulated network "
        f"{args.simnet_cap_mb:g}, so there are several buckets to overlap); {args.iters} steps "
        "per wrapper, the wrappers taking turns step by step in the same ranks; a sample is "
        "the slowest rank's step. 1-minute load average "
        f"{load[0]:.1f} before and {load[1]:.1f} after. Command:",
        "",
        "```",
        cmd.rstrip(),
        "```",
    ]
    for (backend, p), samples in results.items():
        title = f"simulated 10 GbE over {args.simnet_inner}" if backend == "simnet" else backend
        lines += ["", f"{title}, {p} ranks:", ""]
        lines += _table("wrapper", samples, BASELINE)
        if backend == "simnet":
            net = lk.Network.preset("10GbE")
            ar = lk.costmodel.predict("all_reduce", grad_bytes, p, net)
            on = statistics.median(samples["overlap"])
            off = statistics.median(samples["no_overlap"])
            lines += [
                "",
                f"Overlap saves {(off - on) * 1e3:.1f} ms per step ({1 - on / off:.0%} of the "
                f"no-overlap step); the model's all-reduce time for the whole gradient on "
                f"10 GbE is {ar * 1e3:.1f} ms.",
            ]
    text = "\n".join(lines) + "\n"
    publish(text, args.out)
    lk.shutdown()


if __name__ == "__main__":
    main()
