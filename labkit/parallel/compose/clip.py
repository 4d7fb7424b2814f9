"""Gradient clipping after the reduction, for any composition: one global norm, every element once.

Introduced in notebooks/21_capstone.ipynb (clipping under DDP is notebook 09's).

``torch.nn.utils.clip_grad_norm_`` on one process scales every gradient by
``min(1, max_norm / (‖g‖ + 1e-6))`` with ‖g‖ the 2-norm of all gradients together. Split
over ranks, ‖g‖² is a sum over *distinct* elements: each rank adds the squares of its pieces
divided by how many ranks hold the same elements (``copies``: dp for DDP's replicas, tp too
for a LayerNorm beside Megatron's layers, 1 for ZeRO and FSDP shards and for a pipeline
stage's layers), and one all-reduce of that scalar over every rank gives ‖g‖² on each
(torchtitan's ``clip_grad_norm_`` reduces the DTensor norms and then over the pp mesh for
the same reason). Called after the gradients were reduced over dp, so every rank scales the
same global gradient, as one process would.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from labkit.parallel.compose.pieces import Piece, copies, local
from labkit.parallel.dims import ParallelDims

__all__ = ["clip_grad_norm_"]


@torch.no_grad()
def clip_grad_norm_(
    pieces: Sequence[Piece],
    max_norm: float,
    dims: ParallelDims,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Scale every piece's gradient so the model's global gradient 2-norm is at most ``max_norm``.

    Args:
        pieces: what this rank's optimizer updates (``Parallelized.pieces``), gradients
            already reduced over dp.
        max_norm: the largest norm allowed.
        dims: the degrees (how many copies of each piece exist).
        group: every rank of the run (None: the default group), for the one all-reduce.

    Returns:
        The global norm before clipping, a 0-d float32 tensor on the gradients' device (the
        same on every rank), as ``torch.nn.utils.clip_grad_norm_`` returns it.

    Raises:
        ValueError: ``max_norm`` is not positive, or no piece has a gradient.
    """
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    grads = [(local(p.param.grad), copies(p, dims)) for p in pieces if p.param.grad is not None]
    if not grads:
        raise ValueError("no piece has a gradient: call it after backward")
    device = grads[0][0].device
    square = torch.zeros((), dtype=torch.float32, device=device)
    for g, n in grads:
        square += g.detach().float().pow(2).sum() / n
    if dims.world_size > 1:
        dist.all_reduce(square, group=group)  # SUM over every rank: each element counted once
    total = square.sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)  # torch's clip_coef_clamped
    for g, _ in grads:
        g.mul_(coef.to(g.dtype))
    return total
