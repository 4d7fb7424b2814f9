"""A composed run's training state for DCP: every piece stored once, as a global tensor.

Introduced in notebooks/21_capstone.ipynb (DCP itself is notebooks/19_fault_tolerance.ipynb's).

``torch.distributed.checkpoint`` stores a plain tensor that several ranks hold under one name
*once* (it deduplicates by name), which is right for DDP's replicas and wrong for a Megatron
slice or a ZeRO shard: two ranks' different slices under one name would keep only one. So each
``Piece`` split along an axis is saved as what it is, a shard of a global tensor: a DTensor
(``DTensor.from_local`` on that axis of the mesh, ``Shard(dim)``), sharing the local storage,
so that loading writes the values back in place. FSDP2's parameters are DTensors already.
Adam's states follow their parameter; the schedule, the step, the parameter groups'
hyperparameters and each rank's RNGs (under a key of its own) go in as plain values. With
the same layout on resume, every tensor comes back bit for bit (notebook 21 and
tests/test_parallel_compose.py check it with ``torch.equal``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from labkit.checkpoint import capture_rng, load_sharded, restore_rng
from labkit.parallel.compose.pieces import Piece

if TYPE_CHECKING:
    from labkit.parallel.compose.parallelize import Parallelized

__all__ = ["checkpoint_state", "init_optimizer_state", "load_state"]


def _global(piece: Piece, t: torch.Tensor, mesh: Any) -> Any:
    """``t`` (this rank's piece, or a state shaped like it) as DCP should see it."""
    if hasattr(t, "placements") or not piece.split:
        return t  # a DTensor says its layout; a whole tensor is the same on every rank
    from torch.distributed.tensor import DTensor, Shard

    axes = [a for a in mesh.mesh_dim_names if a in piece.split]
    sub = mesh[axes[0]] if len(axes) == 1 else mesh[tuple(axes)]
    return DTensor.from_local(t, sub, [Shard(piece.split[a]) for a in axes], run_check=False)


def checkpoint_state(
    parts: Parallelized, optimizer: torch.optim.Optimizer, scheduler: Any, step: int
) -> dict[str, Any]:
    """This rank's part of the training state, ready for ``lk.checkpoint.save_sharded``.

    Args:
        parts: this rank's share of the model.
        optimizer: its optimizer (ZeRO's own Adam under ZeRO).
        scheduler: the learning-rate scheduler (``state_dict``/``load_state_dict``).
        step: optimizer steps taken.

    Returns:
        ``{"model.<name>", "optim.<name>.<state>", "scheduler", "param_groups", "step",
        "rng.rank<r>"}``: the same keys on every rank but the last.
    """
    out: dict[str, Any] = {}
    for piece in parts.pieces:
        out[f"model.{piece.name}"] = _global(piece, piece.param.detach(), parts.mesh)
        for k, v in optimizer.state.get(piece.param, {}).items():
            same = isinstance(v, torch.Tensor) and v.shape == piece.param.shape
            out[f"optim.{piece.name}.{k}"] = _global(piece, v, parts.mesh) if same else v
    out["scheduler"] = scheduler.state_dict()
    groups = optimizer.param_groups
    out["param_groups"] = [{k: v for k, v in g.items() if k != "params"} for g in groups]
    out["step"] = step
    out[f"rng.rank{dist.get_rank()}"] = capture_rng()
    return out


@torch.no_grad()
def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's lazily built state without changing any parameter.

    Before loading into it, the state must exist: one step with zero gradients and a
    learning rate of 0 (``torch.distributed.checkpoint.state_dict._init_optim_state`` does the
    same); every value it creates is then overwritten by the load.

    Args:
        optimizer: a fresh optimizer (a no-op if it has state already).
    """
    if optimizer.state:
        return
    lrs = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = 0.0
        for p in g["params"]:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, lrs, strict=True):
        g["lr"] = lr
    optimizer.zero_grad(set_to_none=False)


def load_state(
    path: Any, parts: Parallelized, optimizer: torch.optim.Optimizer, scheduler: Any
) -> int:
    """Load a checkpoint written from ``checkpoint_state`` into this rank's share, in place.

    Args:
        path: the checkpoint folder (``lk.checkpoint.latest(directory)``).
        parts: this rank's share, built as when it was saved (same strategy and degrees).
        optimizer: its optimizer (state created here if it has none yet).
        scheduler: its scheduler.

    Returns:
        The step the checkpoint was taken after.
    """
    init_optimizer_state(optimizer)
    state = checkpoint_state(parts, optimizer, scheduler, 0)
    load_sharded(path, state)
    scheduler.load_state_dict(state["scheduler"])
    for g, saved in zip(optimizer.param_groups, state["param_groups"], strict=True):
        g.update(saved)
    restore_rng(state[f"rng.rank{dist.get_rank()}"])
    if parts.zero is not None and hasattr(parts.zero, "all_gather_parameters"):
        parts.zero.all_gather_parameters()  # ZeRO-1/2: the shards loaded, now the full copies
    return int(state["step"])
