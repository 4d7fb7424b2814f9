"""Collectives that go wrong on purpose, to read what the debug switches report.

Introduced in notebooks/19_fault_tolerance.ipynb (section 5, debugging a distributed job).

``--mismatch none`` runs one correct all-reduce (with ``NCCL_DEBUG=INFO`` on GPUs it shows
NCCL setting up its communicator); ``shape``: rank 0 all-reduces 3 elements, the others 4;
``skip``: after one all-reduce together, rank 1 skips the second, so its next collective (a
broadcast) meets rank 0's all-reduce. Each rank prints the debug settings it sees, then what
its collectives did (a caught error is printed, not raised); ``--report PREFIX`` also writes
both to ``PREFIX<rank>.json`` (printed lines of several workers can interleave), and
``--fr-dump PREFIX`` writes the rank's flight recorder buffer to ``PREFIX<rank>``. Tensors
live on the rank's device (``labkit.launcher.device_rule``), so on GPUs the collectives run
over NCCL.

Two processes, the collective checker on::

    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc-per-node 2 \\
        -m labkit.scripts.debug_collectives --mismatch skip

NCCL's own log of a correct all-reduce, on a GPU per process::

    NCCL_DEBUG=INFO torchrun --standalone --nproc-per-node 2 \\
        -m labkit.scripts.debug_collectives --backend nccl
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from labkit.debug.flight_recorder import dump_flight_recorder
from labkit.scripts import _common

SETTINGS = (
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_BLOCKING_WAIT",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "NCCL_DEBUG",
)


def collectives(mismatch: str, rank: int, device: torch.device) -> torch.Tensor:
    """The job's collectives, wrong in the way ``mismatch`` names.

    Args:
        mismatch: ``"none"``, ``"shape"`` or ``"skip"``.
        rank: this rank.
        device: where the tensors live.

    Returns:
        The last collective's tensor.
    """
    n = 3 if mismatch == "shape" and rank == 0 else 4
    t = torch.full((n,), float(rank + 1), device=device)
    dist.all_reduce(t)
    if mismatch == "skip":
        if rank != 1:
            dist.all_reduce(t)  # rank 1 skips this one...
        dist.broadcast(t, src=0)  # ...so its broadcast meets the others' all-reduce
    return t


def main(argv: list[str] | None = None) -> int:
    """Run the collectives, report what happened; return the exit code (0: finished).

    Args:
        argv: command-line arguments (None: ``sys.argv[1:]``).

    Returns:
        0, also when a collective raised (its error is printed: that is the point).
    """
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mismatch", choices=("none", "shape", "skip"), default="none")
    p.add_argument("--backend", default="auto", help='"auto" (nccl with a GPU each), gloo, nccl')
    p.add_argument("--timeout", type=float, default=30.0, help="process group timeout, seconds")
    p.add_argument("--fr-dump", default=None, help="write the flight recorder to PREFIX<rank>")
    p.add_argument("--report", default=None, help="write what happened to PREFIX<rank>.json")
    args = p.parse_args(argv)
    env = _common.init(args.backend, args.timeout)
    report = {
        "rank": env.rank,
        "device": str(env.device),
        "settings": {k: os.environ.get(k) for k in SETTINGS},
        "debug_level": dist.get_debug_level().name,
        "ok": None,
        "error": None,
    }
    seen = " ".join(f"{k}={v}" for k, v in report["settings"].items() if v is not None)
    print(f"[rank {env.rank}] env {seen} debug_level={report['debug_level']}", flush=True)
    try:
        t = collectives(args.mismatch, env.rank, env.device)
        if env.device.type == "cuda":
            torch.cuda.synchronize(env.device)
        report["ok"] = t.cpu().tolist()
        print(f"[rank {env.rank}] ok: {report['ok']}", flush=True)
    except RuntimeError as exc:
        report["error"] = str(exc)
        print(f"[rank {env.rank}] caught {type(exc).__name__}: {exc}", flush=True)
    if args.report:
        path = Path(f"{args.report}{env.rank}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report))
    if args.fr_dump:
        backend = "nccl" if env.device.type == "cuda" else "gloo"
        path = dump_flight_recorder(args.fr_dump, env.rank, backend=backend)
        print(f"[rank {env.rank}] flight recorder written to {path}", flush=True)
    return 0


if __name__ == "__main__":
    _common.run(main)
