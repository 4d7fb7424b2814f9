"""Elastic data-parallel training that survives a killed worker: checkpoint, restart, resume.

Introduced in notebooks/19_fault_tolerance.ipynb (torchrun elastic restarts).

``train_ddp`` plus fault tolerance: every ``--every`` steps all ranks save their full
training state (model, optimizer, LR schedule, sampler position, RNGs) with
``lk.checkpoint.save``; on start each rank resumes from ``lk.checkpoint.latest``. When a
worker dies, torchrun's agent stops the others and, while ``--max-restarts`` allows, starts
every worker again (``TORCHELASTIC_RESTART_COUNT`` goes up by one): they resume from the
last complete checkpoint and finish with exactly the parameters of an undisturbed run.
The model has input dropout and the data are reshuffled per epoch, so that holds only
because the RNG and sampler states are restored too.

``--kill-at-step N --kill-rank R`` makes rank R SIGKILL itself after step N, on the first
attempt only (``TORCHELASTIC_RESTART_COUNT == 0``), so the restarted job runs through.

One node, 2 processes, one restart allowed, rank 1 killed after step 13::

    torchrun --nnodes 1 --nproc-per-node 2 --max-restarts 1 \\
        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 --rdzv-id elastic-digits \\
        -m labkit.scripts.train_elastic --steps 30 --every 5 --ckpt-dir /tmp/ckpt \\
        --kill-at-step 13 --kill-rank 1 --out /tmp/elastic.pt

Two nodes, 1 process each (``HOST`` is node 0's address; ``--ckpt-dir`` must be a
filesystem both nodes share, since a restart resumes from what every rank saved)::

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 2 --nproc-per-node 1 \\
        --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id elastic-digits \\
        -m labkit.scripts.train_elastic --steps 30 --every 5 --ckpt-dir /shared/ckpt
    (the same command on node 1)

``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` gives each restart a fresh store: with torchrun's
default shared store a restart on several nodes can read a dead worker's address
(pytorch/pytorch#135712; on one node the script itself separates the attempts).

The checkpoint folder holds one run: delete it (or pick a new one) to start from scratch.
"""

from __future__ import annotations

import os
import signal

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from labkit import checkpoint as ckpt
from labkit import data, models
from labkit.scripts import _common


def main(argv: list[str] | None = None) -> int:
    """Train with checkpoints, resuming from the newest one; return the exit code.

    Args:
        argv: command-line arguments (None: ``sys.argv[1:]``).

    Returns:
        The exit code (0); a killed worker never returns.
    """
    p = _common.base_parser(__doc__)
    p.add_argument("--ckpt-dir", required=True, help="checkpoint folder (shared by all nodes)")
    p.add_argument("--every", type=int, default=5, help="checkpoint every k steps")
    p.add_argument("--keep", type=int, default=2, help="complete checkpoints to keep")
    p.add_argument("--dropout", type=float, default=0.1, help="input dropout probability")
    p.add_argument("--kill-at-step", type=int, default=None, help="SIGKILL after this step")
    p.add_argument("--kill-rank", type=int, default=0, help="the rank that kills itself")
    args = p.parse_args(argv)
    env = _common.init(args.backend, args.timeout)
    torch.manual_seed(args.seed + 1000 + env.rank)  # this rank's dropout masks
    model = nn.Sequential(nn.Dropout(args.dropout), models.MLP(seed=args.seed)).to(env.device)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    ds = data.digits("train")
    dsampler = DistributedSampler(ds, env.world_size, env.rank, shuffle=True, seed=args.seed)
    sampler = ckpt.ResumableSampler(dsampler, batch_size=args.batch_size)
    state = ckpt.TrainState(ddp, opt, sched, sampler)

    path = ckpt.latest(args.ckpt_dir)
    step = state.load_state_dict(ckpt.load(path, rank=env.rank)) if path else 0
    resumed_from = step
    if env.rank == 0:
        print(
            f"[rank 0] attempt {env.restart_count}: "
            + (f"resumed from {path}" if path else "no checkpoint, starting at step 0"),
            flush=True,
        )
    # The loader's own generator: iter(loader) then never draws from the global torch RNG,
    # so a resumed run draws exactly what the uninterrupted one drew.
    gen = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(
        ds, batch_size=args.batch_size, sampler=sampler, drop_last=True, generator=gen
    )
    while step < args.steps:
        for x, y in loader:
            x, y = x.to(env.device), y.to(env.device)
            loss = nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            sampler.advance()
            step += 1
            if step == args.kill_at_step and env.rank == args.kill_rank and env.restart_count == 0:
                print(f"[rank {env.rank}] step {step}: SIGKILL (fault injection)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if step % args.every == 0:
                ckpt.save(args.ckpt_dir, state.state_dict(step), step, keep=args.keep)
            if env.rank == 0 and (step % 10 == 0 or step == args.steps):
                print(f"[rank 0] step {step} loss {loss.item():.4f}", flush=True)
            if step == args.steps:
                break
        else:
            sampler.set_epoch(sampler.epoch + 1)
    del ddp, opt, sched, state
    extra = {
        "world_size": env.world_size,
        "steps": step,
        "resumed_from": resumed_from,
        "restart_count": env.restart_count,
        "epoch": sampler.epoch,
    }
    _common.finish(env, model, args.out, extra)
    return 0


if __name__ == "__main__":
    _common.run(main)
