"""A deterministic, resumable DDP training run on CPU for the checkpoint tests.

``train`` runs on every rank (through ``lk.launch``): digits, an MLP with dropout (so the
per-rank torch RNG matters), inputs jittered with numpy and Python ``random`` noise (so those
RNGs matter too), a shuffling ``DistributedSampler`` (so the sampler position matters), SGD
with momentum and a StepLR schedule (so optimizer and scheduler state matter). It resumes
from the newest complete checkpoint in ``ckpt_dir`` and can SIGKILL itself after a step.
"""

from __future__ import annotations

import os
import random
import signal

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

import labkit as lk
from labkit import checkpoint as ckpt

BATCH = 64  # per rank; 1438 train digits / 2 ranks -> 11 full batches per epoch


def make_model() -> nn.Module:
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def train(
    rank: int,
    world_size: int,
    ckpt_dir: str,
    total_steps: int,
    every: int,
    kill_at: int | None = None,
    kill_rank: int = 1,
    restore_rng: bool = True,
) -> dict:
    """Train to ``total_steps``, checkpointing every ``every`` steps; return the parameters."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(100 + rank)
    np.random.seed(200 + rank)
    random.seed(300 + rank)
    ds = lk.data.digits("train")
    model = make_model()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    dsampler = DistributedSampler(ds, world_size, rank, shuffle=True, seed=0)
    sampler = ckpt.ResumableSampler(dsampler, batch_size=BATCH)
    state = ckpt.TrainState(ddp, opt, sched, sampler)
    path = ckpt.latest(ckpt_dir)
    step = state.load_state_dict(ckpt.load(path), rng=restore_rng) if path else 0
    resumed_from = step
    # Its own generator: each iter(loader) draws a seed, which would otherwise come from the
    # global torch RNG and make the resumed run draw once more than the uninterrupted one.
    gen = torch.Generator().manual_seed(0)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, drop_last=True, generator=gen)
    while step < total_steps:
        for x, y in loader:
            x = x + 0.01 * torch.from_numpy(np.random.randn(*x.shape).astype("float32"))
            x = x * (1.0 + 0.01 * random.random())
            loss = nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            sampler.advance()
            step += 1
            if step == kill_at and rank == kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)
            if step % every == 0:
                ckpt.save(ckpt_dir, state.state_dict(step), step, keep=2)
            if step == total_steps:
                break
        else:
            sampler.set_epoch(sampler.epoch + 1)
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"params": params, "resumed_from": resumed_from, "epoch": sampler.epoch}
