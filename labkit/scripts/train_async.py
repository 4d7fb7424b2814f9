"""Synchronous, asynchronous (parameter server) and local SGD on digits, launched by torchrun.

Introduced in notebooks/08_sync_vs_async.ipynb (the sync-vs-async lab as a script).

Every rank builds ``lk.parallel.async_sgd.digits_problem`` (an MLP on digits; batches are
a pure function of rank and step) and trains it with one or more of:

- ``--mode sync``: every rank computes a gradient per step, an all-reduce averages them
  (``sync_sgd``): the same as one process stepping on the union of the batches;
- ``--mode async``: rank 0 is the parameter server, ranks 1.. are workers that pull the
  parameters, compute a gradient and push it; the server applies each one as it arrives
  and records its staleness (``parameter_server``; needs at least 2 processes);
- ``--mode local``: every rank takes ``--local-steps`` H steps on its own, then the ranks
  average their parameters (``local_sgd``).

``--mode`` takes one mode or several, run one after the other in the same job (each from
the same initial parameters), and rank 0 then prints a table comparing them. ``--steps``
is the number of optimizer steps per rank for sync and local SGD, and the number of
updates the server applies in async mode. ``--slow-rank R --slowdown k`` makes rank R's
every gradient take k times longer (``pace``; ``--step-time`` pads every gradient to a
floor first), so the straggler's cost can be compared across modes. Rank 0 prints, per
mode, the updates and their rate, the staleness (async: mean, the exact prediction
``predicted_mean_staleness`` and their ratio, max, gradients per worker) and the initial
and final loss on the held-out digits; every rank prints the checksum of its parameters
after each mode (in async mode the server's are the trained ones, a worker's are the last
it pulled). ``--out`` saves every mode's parameters and logs (rank 0's).

One node, 3 processes: the three modes with the same straggler, compared::

    torchrun --standalone --nproc-per-node 3 -m labkit.scripts.train_async \\
        --mode sync async local --local-steps 5 --steps 60 --step-time 0.01 \\
        --slow-rank 2 --slowdown 4

Asynchronous only::

    torchrun --standalone --nproc-per-node 3 -m labkit.scripts.train_async \\
        --mode async --steps 60 --step-time 0.01 --slow-rank 2 --slowdown 4

Two nodes, 2 processes each: the same command on both (``HOST`` is node 0's address)::

    torchrun --nnodes 2 --nproc-per-node 2 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id async-digits \\
        -m labkit.scripts.train_async --mode async --steps 60

The messages are CPU tensors over gloo (the server receives from any worker, which NCCL
cannot), so the script always uses gloo.
"""

from __future__ import annotations

import argparse
import os

import torch

from labkit.scripts import _common


def _parser() -> argparse.ArgumentParser:
    p = _common.base_parser(__doc__)
    p.set_defaults(backend="gloo")
    p.add_argument(
        "--mode",
        choices=("sync", "async", "local"),
        nargs="+",
        default=["sync"],
        help="one or more, run in turn in the same job (then compared)",
    )
    p.add_argument(
        "--local-steps", type=int, default=4, metavar="H", help="local SGD: steps between averages"
    )
    p.add_argument("--slow-rank", type=int, default=None, metavar="R", help="the straggler")
    p.add_argument(
        "--slowdown", type=float, default=4.0, metavar="K", help="the straggler is K times slower"
    )
    p.add_argument(
        "--step-time", type=float, default=0.0, help="floor of each gradient's time, seconds"
    )
    p.add_argument("--hidden", type=int, nargs="+", default=[64], help="the MLP's hidden widths")
    return p


def _check(p: argparse.ArgumentParser, args: argparse.Namespace, world_size: int) -> None:
    """Stop before joining the job (exit 2) when the options cannot work on ``world_size``."""
    if args.backend not in ("gloo", "auto"):
        p.error(f"--backend {args.backend}: the messages are CPU tensors, use gloo")
    if args.steps < 1 or args.batch_size < 1 or args.local_steps < 1:
        p.error("--steps, --batch-size and --local-steps must be >= 1")
    if "async" in args.mode and world_size < 2:
        p.error(
            f"--mode async on WORLD_SIZE={world_size}: rank 0 is the parameter server, "
            "so it needs at least 2 processes (1 server + workers)"
        )
    if "async" in args.mode and args.steps < world_size - 1:
        p.error(f"--mode async: --steps {args.steps} < {world_size - 1} workers")
    if args.slow_rank is not None:
        first = 1 if "async" in args.mode else 0
        if not first <= args.slow_rank < world_size:
            who = "a worker of --mode async" if first else "a rank"
            p.error(
                f"--slow-rank {args.slow_rank} on WORLD_SIZE={world_size} must be {who}, "
                f"{first}..{world_size - 1}"
            )
    if not args.slowdown >= 1 or not args.step_time >= 0:
        p.error(f"need --slowdown >= 1 and --step-time >= 0, got {args.slowdown}, {args.step_time}")


def main(argv: list[str] | None = None) -> int:
    """Train in ``--mode``, print updates, staleness, losses and the checksum; return 0.

    Args:
        argv: command-line arguments (None: ``sys.argv[1:]``).

    Returns:
        The exit code.
    """
    from labkit.parallel import async_sgd as A

    p = _parser()
    args = p.parse_args(argv)
    _check(p, args, int(os.environ.get("WORLD_SIZE", "1")))
    env = _common.init("gloo", args.timeout)
    problem = A.digits_problem(args.batch_size, args.lr, tuple(args.hidden), args.seed)
    straggler = None if args.slow_rank is None else (args.slow_rank, args.slowdown)
    common = {"straggler": straggler, "step_time_s": args.step_time, "timeout_s": args.timeout}
    runs: dict[str, dict] = {}
    for mode in args.mode:
        if mode == "sync":
            log = A.sync_sgd(problem, args.steps, **common)
        elif mode == "local":
            log = A.local_sgd(problem, args.steps, args.local_steps, **common)
        else:
            log = A.parameter_server(problem, args.steps, **common)
        if env.rank == 0:
            _report(mode, log, args)
        model = problem.model_fn()
        torch.nn.utils.vector_to_parameters(log.params, model.parameters())
        sha, total = _common.digest(model)
        print(f"[rank {env.rank}] {mode} params sha256={sha} sum={total:.10f}", flush=True)
        runs[mode] = {
            "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "sha256": sha,
            "initial_loss": log.initial_loss,
            "losses": list(log.loss),
            "wall_s": list(log.wall_s),
            "update": list(log.update),
            "staleness": list(log.staleness),
            "worker": list(log.worker),
            "per_worker": dict(log.per_worker),
        }
    if env.rank == 0 and len(runs) > 1:
        _compare(runs)
    extra = {"modes": runs, "world_size": env.world_size, "steps": args.steps}
    _common.finish(env, model, args.out, extra)  # the last mode's parameters
    return 0


def _compare(runs: dict[str, dict]) -> None:
    """Rank 0's table: every mode's updates, wall time, rate and final loss."""
    print("[rank 0] mode    updates   wall s  updates/s  final loss", flush=True)
    for mode, r in runs.items():
        n, wall = r["update"][-1], r["wall_s"][-1]
        print(
            f"[rank 0] {mode:<6} {n:>8} {wall:>8.3f} {n / wall if wall else 0:>10.1f} "
            f"{r['losses'][-1]:>11.4f}",
            flush=True,
        )


def _report(mode: str, log, args: argparse.Namespace) -> None:  # log: rank 0's TrainLog
    from labkit.parallel.async_sgd import predicted_mean_staleness

    updates = log.update[-1] if log.update else 0
    print(
        f"[rank 0] {mode}: {updates} updates from {log.n_workers} workers in "
        f"{log.wall_s[-1]:.2f} s ({log.updates_per_s:.1f} updates/s)",
        flush=True,
    )
    if mode == "async":
        stale = log.staleness
        mean = sum(stale) / len(stale)
        predicted = predicted_mean_staleness(len(stale), log.n_workers)
        per_worker = ", ".join(f"{w}: {n}" for w, n in sorted(log.per_worker.items()))
        print(
            f"[rank 0] staleness mean {mean:.4f} (predicted {predicted:.4f}, "
            f"ratio {mean / predicted if predicted else float('nan'):.3f}) max {max(stale)}; "
            f"gradients per worker {{{per_worker}}}",
            flush=True,
        )
    elif mode == "sync":
        print("[rank 0] staleness 0: every step waits for every rank's gradient", flush=True)
    else:
        print(
            f"[rank 0] {len(log.averaged)} parameter averages (every {args.local_steps} "
            "local steps), staleness 0",
            flush=True,
        )
    print(
        f"[rank 0] {mode} loss initial {log.initial_loss:.4f} final {log.final_loss:.4f}",
        flush=True,
    )


if __name__ == "__main__":
    _common.run(main)
