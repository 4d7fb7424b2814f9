"""The capstone's training loop on every rank, and the same recipe on one process.

Introduced in notebooks/21_capstone.ipynb.

Each rank builds the whole TinyGPT (seeded), composes its share with
``labkit.parallel.compose`` (``parallelize_gpt``), and runs the course's loop, one
``train_step`` per optimizer step (notebook 21 prints it): its dp slice of the global batch in
``microbatches`` with one gradient reduction (``forward_backward``), bf16 autocast if asked,
the global gradient norm clipped after the reduction (``clip_grad_norm_``), Adam, the warmup +
cosine schedule; a DCP checkpoint after ``ckpt_at`` steps, and with ``resume`` a start from
the newest one. ``train_reference`` is the same recipe on one process with
``torch.nn.utils.clip_grad_norm_``: with the gradients averaged, every strategy takes its
steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from labkit.capstone.config import (
    RunConfig,
    autocast_context,
    build_model,
    global_batch,
    make_schedule,
)
from labkit.capstone.gpt import lm_loss, parallelize_gpt
from labkit.capstone.strategy import Strategy
from labkit.checkpoint import latest, save_sharded
from labkit.data import char_corpus
from labkit.launcher import get_device
from labkit.mesh import build_mesh, dp_shard
from labkit.parallel.compose import (
    Parallelized,
    checkpoint_state,
    clip_grad_norm_,
    forward_backward,
    full_parameters,
    load_state,
    rank_state_bytes,
)
from labkit.trace import sync_device

__all__ = [
    "build_rank",
    "checkpoint_dir",
    "eval_steps",
    "train_rank",
    "train_reference",
    "train_step",
]


def eval_steps(config: RunConfig) -> list[int]:
    """The steps after which the validation loss is measured (and after the last)."""
    c = config
    return sorted({*range(c.eval_every, c.steps, c.eval_every), c.steps})


def train_step(
    parts: Parallelized,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    x: torch.Tensor,
    y: torch.Tensor,
    config: RunConfig,
    microbatches: int,
    context: Callable[[], Any],
) -> tuple[float | None, float]:
    """One optimizer step of the capstone's recipe on this rank's share ``(x, y)`` of the batch.

    Args:
        parts: this rank's share of the model (``parallelize_gpt``).
        optimizer: its Adam (ZeRO's own under ZeRO).
        schedule: the learning-rate schedule (``make_schedule``).
        x, y: this rank's dp slice of the step's batch.
        config: the run (``max_norm``).
        microbatches: k, micro-batches of accumulation (1 under a pipeline, which has its own).
        context: the autocast context factory (``autocast_context``).

    Returns:
        ``(loss, norm)``: the mean loss of ``x`` (None on pipeline ranks without it) and the
        global gradient norm before clipping (NaN without ``max_norm``).
    """
    parts.zero_grad(optimizer)
    # k micro-batches, autocast around each forward; one dp reduction, after the last
    loss = forward_backward(parts, x, y, lm_loss, microbatches=microbatches, context=context)
    norm = float("nan")
    if config.max_norm is not None:  # after the reduction: every rank clips the same gradient
        norm = float(clip_grad_norm_(parts.pieces, config.max_norm, parts.dims))
    parts.step(optimizer)  # Adam (ZeRO: on the shards, then its all-gathers)
    schedule.step()  # warmup, then cosine
    return loss, norm


def checkpoint_dir(config: RunConfig, strategy: Strategy) -> Path:
    """Where ``strategy``'s checkpoints go: a folder of its own under ``config.ckpt_dir``.

    Raises:
        ValueError: no ``ckpt_dir``.
    """
    if not config.ckpt_dir:
        raise ValueError("the run has no ckpt_dir")
    return Path(config.ckpt_dir) / strategy.key.replace("·", "-")


def build_rank(
    strategy: Strategy, config: RunConfig, device: torch.device, vocab_size: int
) -> tuple:
    """This rank's mesh, model share, Adam, schedule and autocast context for a run.

    Call it inside the run's default group (``lk.launch``'s, or torch's fake one for
    ``labkit.bench_framework``).

    Args:
        strategy, config: the run.
        device: this rank's device.
        vocab_size: the corpus's characters.

    Returns:
        ``(mesh, parts, optimizer, schedule, context)``.

    Raises:
        ValueError: sizes the strategy cannot split.
    """
    s, c = strategy, config
    c.check(s)
    mesh = build_mesh(s.dims, device.type)
    model = build_model(c, vocab_size).to(device)
    parts = parallelize_gpt(model, s, mesh, c.seq_len, c.lr)
    opt = parts.make_adam()
    return mesh, parts, opt, make_schedule(opt, c), autocast_context(c, device)


def train_rank(rank: int, world_size: int, strategy: Strategy, config: RunConfig) -> dict:
    """One rank of a run (``lk.launch`` or torchrun calls it); returns what this rank measured.

    Args:
        rank: global rank.
        world_size: must equal ``strategy.world_size``.
        strategy: how to split the model.
        config: the run.

    Returns:
        ``{"first_step", "losses", "grad_norms", "lrs", "val_steps", "val_losses", "step_s",
        "bytes", "chain", "full_state"}``: the step it started from (0, or the checkpoint's),
        the whole batch's loss at each step, the global gradient norm before clipping (NaN
        without ``max_norm``) and the learning rate of each step, the validation losses
        (equal on every rank), the slowest rank's seconds per step, this rank's bytes of
        parameters, gradients and optimizer states after training, the ``apply_*`` calls
        that built it, and (rank 0 only, else None) every parameter in full on the CPU.

    Raises:
        ValueError: a world size other than the strategy's, or sizes it cannot split.
    """
    s, c = strategy, config
    if world_size != s.world_size:
        raise ValueError(f"{s.label} needs {s.world_size} ranks, launched on {world_size}")
    device, corpus = get_device(), char_corpus()
    mesh, parts, opt, schedule, context = build_rank(s, c, device, corpus.vocab_size)
    start = 0
    if c.resume:
        path = latest(checkpoint_dir(c, s))
        if path is None:
            raise FileNotFoundError(f"resume: no complete checkpoint in {checkpoint_dir(c, s)}")
        start = load_state(path, parts, opt, schedule)

    def mine(t: torch.Tensor) -> torch.Tensor:  # this rank's data-parallel slice
        return dp_shard(t, s.dims, mesh).to(device)

    def agree(value: float | None, op: Any = dist.ReduceOp.SUM) -> float:
        # mean over the ranks that have a value (the pipeline's last stage), or the MAX
        t = torch.tensor(
            [value or 0.0, float(value is not None)], dtype=torch.float64, device=device
        )
        dist.all_reduce(t, op=op)
        return float(t[0] / t[1]) if op == dist.ReduceOp.SUM else float(t[0])

    xv, yv = (mine(t) for t in global_batch(corpus, c, -1))
    out: dict[str, Any] = {"first_step": start, "losses": [], "grad_norms": [], "lrs": []}
    out |= {"step_s": [], "val_steps": [start]}
    out["val_losses"] = [agree(parts.evaluate(xv, yv, lm_loss, context))]
    m = s.microbatches if s.pp == 1 else 1  # a pipeline runs its micro-batches itself
    for k in range(start, c.steps):
        x, y = (mine(t) for t in global_batch(corpus, c, k))
        dist.barrier()
        sync_device(device)  # on a GPU, a step's time covers its kernels and transfers
        t0 = time.perf_counter()
        out["lrs"].append(opt.param_groups[0]["lr"])
        loss, norm = train_step(parts, opt, schedule, x, y, c, m, context)
        sync_device(device)
        out["step_s"].append(agree(time.perf_counter() - t0, dist.ReduceOp.MAX))
        out["losses"].append(agree(loss))
        out["grad_norms"].append(norm)
        if c.ckpt_at == k + 1:
            state = checkpoint_state(parts, opt, schedule, k + 1)
            save_sharded(checkpoint_dir(c, s), state, k + 1)
        if k + 1 in eval_steps(c):
            out["val_steps"].append(k + 1)
            out["val_losses"].append(agree(parts.evaluate(xv, yv, lm_loss, context)))
    out["bytes"] = rank_state_bytes(parts, opt)
    out["chain"] = parts.chain
    full = full_parameters(parts)
    out["full_state"] = full if rank == 0 else None
    return out


def train_reference(config: RunConfig) -> dict:
    """The same recipe on one process: TinyGPT, Adam, the schedule, clipping, on the whole batch.

    Returns:
        ``{"losses", "grad_norms", "lrs", "val_steps", "val_losses", "model"}`` (the trained
        model); a gradient norm is ``torch.nn.utils.clip_grad_norm_``'s (NaN without
        ``max_norm``).
    """
    c = config
    corpus = char_corpus()
    model = build_model(c, corpus.vocab_size)
    opt = torch.optim.Adam(model.parameters(), lr=c.lr)
    schedule = make_schedule(opt, c)
    context = autocast_context(c, torch.device("cpu"))
    xv, yv = global_batch(corpus, c, -1)

    def val() -> float:
        with torch.no_grad(), context():
            return lm_loss(model(xv), yv).item()

    out: dict[str, Any] = {"losses": [], "grad_norms": [], "lrs": [], "val_steps": [0]}
    out["val_losses"] = [val()]
    for k in range(c.steps):
        x, y = global_batch(corpus, c, k)
        out["lrs"].append(opt.param_groups[0]["lr"])
        opt.zero_grad()
        with context():
            loss = lm_loss(model(x), y)
        loss.backward()
        norm = float("nan")
        if c.max_norm is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), c.max_norm))
        opt.step()
        schedule.step()
        out["losses"].append(loss.item())
        out["grad_norms"].append(norm)
        if k + 1 in eval_steps(c):
            out["val_steps"].append(k + 1)
            out["val_losses"].append(val())
    out["model"] = model
    return out
