"""An MLP on digits cut into one stage per rank (naive model parallelism), launched by torchrun.

Introduced in notebooks/10_model_parallel.ipynb (the model-parallel lab as a script).

Every rank builds the same ``lk.models.MLP`` (seeded, ``--n-linear`` Linear layers of width
``--hidden``), cuts its layers into ``WORLD_SIZE`` stages with
``lk.parallel.model_split.split_model`` (evenly, or at ``--bounds``) and keeps its own:
rank r runs stage r with ``ModelSplit`` (activations sent forward, gradients back, over
send/recv) and SGD on its stage's parameters. Rank 0 reads the batch of each step (a seeded
shuffle of ``lk.data.digits("train")``, the same on every rank), the last rank the targets
and the loss, which it prints. Every rank prints its layers, the messages and bytes it sent
per step and the bytes it holds; at the end the stages' parameters are gathered into one
unsplit MLP on every rank, which prints its checksum. A job with more ranks than layers,
or ``--bounds`` that do not cut the model into ``WORLD_SIZE`` stages, stops every rank
before the process group starts.

One node, 2 processes (2 stages)::

    torchrun --standalone --nproc-per-node 2 -m labkit.scripts.train_model_split --steps 20

Two nodes, 2 processes each (4 stages), the same command on both (``HOST`` is node 0's
address, reachable from node 1; the c10d rendezvous assigns the ranks, so no
``--node-rank``)::

    torchrun --nnodes 2 --nproc-per-node 2 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id mlp-split \\
        -m labkit.scripts.train_model_split --steps 20

Only one stage computes at any moment (a rank idles (p − 1)/p of the step); the same world
size gives the same checksum on one node or on several.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from labkit import data, models
from labkit.parallel import model_split as msp
from labkit.scripts import _common
from labkit.trace import sync_device


def _parser() -> argparse.ArgumentParser:
    p = _common.base_parser(__doc__)
    p.add_argument("--n-linear", type=int, default=4, help="Linear layers of the MLP")
    p.add_argument("--hidden", type=int, default=64, help="width of every hidden layer")
    p.add_argument(
        "--bounds",
        default=None,
        help="layer indices 0,a1,...,len where the stages start (default: even cut)",
    )
    return p


def build(args) -> models.MLP:
    """The MLP of the parsed options (the same weights for the same seed on every rank)."""
    if args.n_linear < 1 or args.hidden < 1:
        raise ValueError(f"need n_linear >= 1 and hidden >= 1, got {args.n_linear}, {args.hidden}")
    hidden = (args.hidden,) * (args.n_linear - 1)
    return models.MLP(in_features=64, hidden=hidden, out_features=10, seed=args.seed)


def stages_of(model: models.MLP, world_size: int, bounds: str | None) -> list[nn.Sequential]:
    """``model``'s layers cut into ``world_size`` stages, evenly or at ``bounds`` ("0,3,7").

    Raises:
        ValueError: more stages than layers, or bounds that do not cut the model into
            ``world_size`` non-empty stages.
    """
    cut = None
    if bounds is not None:
        try:
            cut = [int(b) for b in bounds.split(",")]
        except ValueError:
            raise ValueError(
                f"--bounds {bounds!r} is not a comma-separated list of integers"
            ) from None
    return msp.split_model(model.net, world_size, cut)


def batch(ds, step: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``size`` samples of step ``step``: epochs of a seeded shuffle, the last partial
    batch of each epoch dropped (the same on every rank).

    Args:
        ds: a ``TensorDataset`` of (x, label).
        step: the optimizer step (0-based).
        size: samples per step.
        seed: the shuffle's seed.

    Returns:
        ``(x, y)`` of ``size`` rows.
    """
    per_epoch = len(ds) // size
    if per_epoch < 1:
        raise ValueError(f"batch size {size} exceeds the {len(ds)} samples")
    epoch, k = divmod(step, per_epoch)
    perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed + epoch))
    idx = perm[k * size : (k + 1) * size]
    x, y = ds.tensors
    return x[idx], y[idx]


def main(argv: list[str] | None = None) -> int:
    """Train the split MLP, print per-rank traffic and bytes and the checksum; return 0.

    Args:
        argv: command-line arguments (None: ``sys.argv[1:]``).

    Returns:
        The exit code (2, from argparse, for a split the job cannot run).
    """
    p = _parser()
    args = p.parse_args(argv)
    # Checked before the process group starts: every rank stops at once, nothing waits.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        if args.steps < 1 or args.batch_size < 1:
            raise ValueError(f"need steps and batch size >= 1, got {args.steps}, {args.batch_size}")
        model = build(args)
        stages = stages_of(model, world_size, args.bounds)
    except ValueError as e:
        p.error(f"{world_size} stages: {e}")
    env = _common.init(args.backend, args.timeout)
    r, last = env.rank, env.world_size - 1
    model.to(env.device)
    ds = data.digits("train")
    x0, _ = batch(ds, 0, args.batch_size, args.seed)
    shapes = msp.output_shapes(stages, x0.to(env.device))
    stage = stages[r]
    split = msp.ModelSplit(stage, shapes, nn.functional.cross_entropy, timeout_s=args.timeout)
    opt = torch.optim.SGD(stage.parameters(), lr=args.lr, momentum=0.9)
    losses, step_s = [], []
    for k in range(args.steps):
        x, y = (t.to(env.device) for t in batch(ds, k, args.batch_size, args.seed))
        dist.barrier()
        sync_device(env.device)  # on a GPU, time the step's kernels and NCCL transfers too
        t0 = time.perf_counter()
        opt.zero_grad()
        res = split.step(x if split.is_first else None, y if split.is_last else None)
        opt.step()
        sync_device(env.device)
        step_s.append(time.perf_counter() - t0)
        if split.is_last:
            losses.append(res.loss)
            if (k + 1) % 10 == 0 or k + 1 == args.steps:
                print(f"[rank {r}] step {k + 1} loss {res.loss:.4f}", flush=True)
    mem = msp.measure_stage_memory(stage, opt, res.activation_bytes)
    kinds = ", ".join(type(m).__name__ for m in stage)
    print(
        f"[rank {r}] stage {r}: {len(stage)} layers ({kinds}); per step {res.n_sends} sends, "
        f"{res.bytes_sent} bytes sent; holds params={mem.params_bytes:.0f} "
        f"grads={mem.grads_bytes:.0f} optimizer={mem.optimizer_bytes:.0f} "
        f"activations={mem.activation_bytes:.0f} bytes; "
        f"{1e3 * sum(step_s) / len(step_s):.2f} ms/step",
        flush=True,
    )

    # Every stage's parameters into the unsplit model, on every rank.
    mine = {id(q) for q in stage.parameters()}
    own = {n: q.detach().cpu() for n, q in model.named_parameters() if id(q) in mine}
    parts: list[dict | None] = [None] * env.world_size
    dist.all_gather_object(parts, own)
    params = dict(model.named_parameters())
    full = {n: t for part in parts for n, t in part.items()}
    if full.keys() != params.keys():
        raise RuntimeError(f"gathered names {sorted(full)} differ from {sorted(params)}")
    with torch.no_grad():
        for n, q in params.items():
            q.copy_(full[n])
    final_losses: list[list[float] | None] = [None] * env.world_size
    dist.all_gather_object(final_losses, losses)
    extra = {"world_size": env.world_size, "steps": args.steps, "losses": final_losses[last]}
    del split, opt, stages, stage
    _common.finish(env, model, args.out, extra)
    return 0


if __name__ == "__main__":
    _common.run(main)
