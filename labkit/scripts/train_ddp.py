"""Data-parallel training of an MLP on digits, launched by torchrun on one node or many.

Introduced in notebooks/06_data_parallel.ipynb (the data-parallel lab as a script); the
options of notebooks/09_accumulation_and_precision.ipynb (``--accum-steps``, ``--clip``,
``--precision``) and notebooks/20_performance_tuning.ipynb (``--profile``) run here too.

Every rank builds the same ``lk.models.MLP`` (seeded), trains on its shard of
``lk.data.digits("train")`` (a seeded ``DistributedSampler``) with SGD, and gradients are
averaged by PyTorch's ``DistributedDataParallel`` (``--ddp torch``) or by labkit's
``DataParallelBucketed`` (``--ddp labkit``). It prints a checksum of the final parameters;
the same global world size gives the same bits on one node or on two.

One node, 2 processes::

    torchrun --standalone --nproc-per-node 2 -m labkit.scripts.train_ddp --steps 20

Two nodes, 1 process each: the same command on both (``HOST`` is node 0's address,
reachable from node 1; the c10d rendezvous assigns the ranks, so no ``--node-rank``)::

    torchrun --nnodes 2 --nproc-per-node 1 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id ddp-digits \\
        -m labkit.scripts.train_ddp --steps 20

Both "nodes" on one machine over loopback (what tests/test_scripts_torchrun.py does; both
agents match 127.0.0.1, so ``is_host`` says which one hosts the rendezvous store)::

    GLOO_SOCKET_IFNAME=lo torchrun --nnodes 2 --nproc-per-node 1 \\
        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 --rdzv-id ddp-digits \\
        --rdzv-conf is_host=1 --local-addr 127.0.0.1 -m labkit.scripts.train_ddp --steps 20
    (and the same with ``--rdzv-conf is_host=0`` in a second shell)

Notebook 09, gradient accumulation (``lk.parallel.accumulate``): each rank's
``--batch-size`` samples per step are cut into ``--accum-steps`` micro-batches, every
backward but the last runs in ``no_sync()``, so gradients are all-reduced once per step;
``--clip`` clips the averaged gradient's norm after that all-reduce; ``--precision bf16``
runs the forward under bf16 autocast, ``--precision fp16`` under fp16 autocast with a
``torch.amp.GradScaler`` of the ranks' device type (``"cpu"`` under gloo, ``"cuda"`` under
NCCL: both work in torch 2.13), which scales every micro-batch's loss, unscales before the
clipping and skips a step whose gradients overflowed (``lk.precision``)::

    torchrun --standalone --nproc-per-node 2 -m labkit.scripts.train_ddp --steps 20 \\
        --accum-steps 4 --clip 1.0 --precision fp16

Notebook 20, profiling the DDP step (``lk.profile.profile_steps``): steps 1-5 of the run
go through torch.profiler (skip 1, warm up 1, record 3); every rank writes its Chrome
trace to ``DIR/rank{r}.json`` (open it in https://ui.perfetto.dev) and rank 0 prints its
step time, compute and communication, and its top ops. The profiled steps are training
steps: the checksum is that of the same run without ``--profile``::

    torchrun --standalone --nproc-per-node 2 -m labkit.scripts.train_ddp --steps 20 \\
        --profile /tmp/ddp_traces
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from labkit import data, models
from labkit.scripts import _common

PROFILE_SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}  # steps 1-5 run under the profiler


class _Autocast(nn.Module):
    """The wrapped model with its forward under ``lk.precision.autocast``; output in fp32.

    ``no_sync`` is the wrapped model's, so ``lk.parallel.accumulate`` still skips the
    all-reduce of every micro-batch but the last.
    """

    def __init__(self, inner: nn.Module, precision: str, device: torch.device) -> None:
        super().__init__()
        self.inner, self.precision, self.device = inner, precision, device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from labkit.precision import autocast

        with autocast(self.precision, self.device):
            out = self.inner(x)
        return out.float()  # the loss in fp32, as lk.precision.mixed_precision_step does

    def no_sync(self):  # the inner model's context manager
        return self.inner.no_sync()


def _parser() -> argparse.ArgumentParser:
    p = _common.base_parser(__doc__)
    p.add_argument("--ddp", choices=("torch", "labkit"), default="torch", help="DDP wrapper")
    p.add_argument(
        "--accum-steps",
        type=int,
        default=1,
        metavar="K",
        help="micro-batches per optimizer step per rank (one all-reduce per step)",
    )
    p.add_argument(
        "--clip", type=float, default=None, metavar="NORM", help="clip the averaged gradient"
    )
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument(
        "--profile", default=None, metavar="DIR", help="Chrome traces of steps 1-5 go here"
    )
    return p


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop before joining the job (exit 2) when the options cannot work."""
    from labkit.precision import unsupported_reason

    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    if not 1 <= args.accum_steps <= args.batch_size:
        p.error(
            f"--accum-steps must be in 1..--batch-size ({args.batch_size}): each of the "
            f"{args.accum_steps} micro-batches needs at least one sample"
        )
    if args.clip is not None and not args.clip > 0:
        p.error(f"--clip must be > 0, got {args.clip}")
    # Before the group exists, this host's view of the device rule (one GPU per local worker);
    # main() checks again with the device every rank agreed on.
    workers = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpu = torch.cuda.is_available() and torch.cuda.device_count() >= workers
    device = "cuda" if gpu and args.backend in ("auto", "nccl") else "cpu"
    reason = unsupported_reason(args.precision, device)
    if reason is not None:
        p.error(f"--precision {args.precision}: {reason}")
    steps = sum(PROFILE_SCHEDULE.values())
    if args.profile is not None and args.steps < steps:
        p.error(f"--profile records steps 1-{steps}: needs --steps >= {steps}")


def _batches(loader: DataLoader, sampler: DistributedSampler) -> Iterator:
    """The loader's batches, epoch after epoch (the sampler reshuffled for each)."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _step(args, env, ddp, opt, batches, scaler, done: list[int]) -> None:
    """One optimizer step on the next batch; rank 0 prints the loss every 10 steps."""
    x, y = next(batches)
    x, y = x.to(env.device), y.to(env.device)
    loss_fn = nn.functional.cross_entropy
    norm = float("nan")
    if args.accum_steps == 1 and args.clip is None and args.precision == "fp32":
        loss_t = loss_fn(ddp(x), y)  # the plain step of notebook 06
        opt.zero_grad()
        loss_t.backward()
        opt.step()
        loss = loss_t.item()
    else:
        from labkit.parallel.accumulate import accumulation_step, split_micro_batches

        micro = split_micro_batches(x, y, args.accum_steps)
        if args.precision != "fp32":
            ddp = _Autocast(ddp, args.precision, env.device)
        out = accumulation_step(ddp, opt, micro, loss_fn, args.clip, scaler)
        loss, norm = out["loss"], out["grad_norm"]
    done.append(1)
    step = len(done)
    if env.rank == 0 and (step % 10 == 0 or step == args.steps):
        extra = f" grad_norm {norm:.4f}" if args.clip is not None else ""
        extra += f" loss_scale {scaler.get_scale():g}" if scaler is not None else ""
        print(f"[rank 0] step {step} loss {loss:.4f}{extra}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Train, print the final parameter checksum, save it to ``--out``; return 0.

    Args:
        argv: command-line arguments (None: ``sys.argv[1:]``).

    Returns:
        The exit code.
    """
    p = _parser()
    args = p.parse_args(argv)
    _check(p, args)
    env = _common.init(args.backend, args.timeout)
    from labkit.precision import unsupported_reason

    reason = unsupported_reason(args.precision, env.device)
    if reason is not None:  # every rank has the same device, so every rank stops here
        raise SystemExit(f"[rank {env.rank}] --precision {args.precision}: {reason}")
    model = models.MLP(seed=args.seed).to(env.device)
    if args.ddp == "torch":
        ddp: nn.Module = nn.parallel.DistributedDataParallel(model)
    else:
        from labkit.parallel.ddp import DataParallelBucketed

        ddp = DataParallelBucketed(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    ds = data.digits("train")
    sampler = DistributedSampler(ds, env.world_size, env.rank, shuffle=True, seed=args.seed)
    # The loader's own generator: iter(loader) then never draws from the global torch RNG.
    gen = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(
        ds, batch_size=args.batch_size, sampler=sampler, drop_last=True, generator=gen
    )
    batches = _batches(loader, sampler)
    scaler = None
    if args.precision == "fp16":
        from labkit.precision import make_scaler

        scaler = make_scaler(args.precision, env.device)
    done: list[int] = []  # one entry per step taken
    train_step = functools.partial(_step, args, env, ddp, opt, batches, scaler, done)
    if args.profile is not None:
        from labkit.profile import comm_compute, profile_steps

        prof = profile_steps(train_step, args.profile, **PROFILE_SCHEDULE)
        print(f"[rank {env.rank}] trace {prof.trace_path}", flush=True)
        if env.rank == 0:
            _print_profile(prof, comm_compute([prof])[0])
    while len(done) < args.steps:
        train_step()
    del train_step, ddp, opt
    extra = {"world_size": env.world_size, "steps": len(done), "accum_steps": args.accum_steps}
    extra["precision"] = args.precision
    extra["loss_scale"] = scaler.get_scale() if scaler is not None else None
    _common.finish(env, model, args.out, extra)
    return 0


def _print_profile(prof, row) -> None:  # a RankProfile and its CommComputeRow
    ms = ", ".join(f"{t:.2f}" for t in prof.step_ms)
    print(
        f"[rank 0] profiled steps {sum(PROFILE_SCHEDULE.values()) - prof.steps + 1}-"
        f"{sum(PROFILE_SCHEDULE.values())}: {ms} ms; per step compute {row.compute_ms:.2f} ms, "
        f"comm {row.comm_ms:.2f} ms, overlap {row.overlap_ms:.2f} ms, "
        f"other {row.other_ms:.2f} ms",
        flush=True,
    )
    for r in prof.top_ops(5):
        print(
            f"[rank 0]   {r.name[:40]:<40} {r.calls:>4} calls  self {r.self_cpu_ms:8.2f} ms "
            f"({100 * r.share:.1f} %)",
            flush=True,
        )


if __name__ == "__main__":
    _common.run(main)
