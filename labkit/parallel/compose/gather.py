"""A composed model's parameters in full, and the bytes each rank holds, whatever the split.

Introduced in notebooks/21_capstone.ipynb (comparing every strategy with one process, and the
bytes per rank with the planner).

Both read ``Parallelized.pieces``: a ZeRO shard is gathered by its stage
(``full_parameters``), a DTensor by ``full_tensor()``, a Megatron slice by an all-gather over
the tp group along its split dim, and a pipeline stage's parameters travel to every stage
(``all_gather_object`` over pp). Bytes are counted per storage, as notebook 13 does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from labkit.mesh import axis_group
from labkit.parallel.compose.pieces import local
from labkit.parallel.compose.tp import gather_tp
from labkit.parallel.zero import fsdp_rank_bytes, storage_bytes

if TYPE_CHECKING:
    from labkit.parallel.compose.parallelize import Parallelized

__all__ = ["full_parameters", "full_tensor", "rank_state_bytes"]


def full_tensor(t: Any) -> torch.Tensor:
    """A DTensor gathered whole on every rank of its mesh (collective): ``t.full_tensor()``.

    A 2-D DTensor (FSDP2 × TP) is gathered one mesh axis after the other, and torch logs a
    warning saying so at every call; expected here, so it is silenced for the call.

    Args:
        t: a DTensor.

    Returns:
        The whole tensor (a plain tensor on ``t``'s device).
    """
    redistribute = logging.getLogger("torch.distributed.tensor._redistribute")
    level = redistribute.level
    redistribute.setLevel(logging.ERROR)
    try:
        return t.full_tensor()
    finally:
        redistribute.setLevel(level)


def full_parameters(parts: Parallelized) -> dict[str, torch.Tensor]:
    """Every parameter of the unsplit model, whole, as CPU copies (collective: every rank).

    Args:
        parts: this rank's share.

    Returns:
        ``{name: tensor}`` with the unsplit model's names, the same on every rank.
    """
    if parts.zero is not None:
        return {k: v.cpu() for k, v in parts.zero.full_parameters().items()}
    out: dict[str, torch.Tensor] = {}
    tp = axis_group(parts.mesh, "tp") if parts.dims.tp_enabled else None
    for piece in parts.pieces:
        t: Any = piece.param.detach()
        if hasattr(t, "full_tensor"):
            t = full_tensor(t)
        elif "tp" in piece.split:
            t = gather_tp(t, piece.split["tp"], tp)
        out[piece.name] = t.cpu().clone()
    if parts.pipeline is not None:  # every stage's parameters, to every rank
        stages: list[dict | None] = [None] * parts.dims.pp
        dist.all_gather_object(stages, out, group=parts.pipeline.group)
        out = {k: v for part in stages for k, v in part.items()}
    return out


def rank_state_bytes(parts: Parallelized, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds in parameters, gradients and optimizer states (each storage once).

    ZeRO counts its own buffers (``ZeroBase.rank_bytes``), FSDP2 its local shards
    (``fsdp_rank_bytes``); otherwise the storages of the parameters, of their gradients (DDP's
    bucket buffers count once) and of the optimizer's state tensors.

    Args:
        parts: this rank's share.
        optimizer: its optimizer (``parts.make_adam()``).

    Returns:
        ``{"params": ..., "grads": ..., "optimizer": ...}``.
    """
    if parts.zero is not None:
        b = parts.zero.rank_bytes()
    elif hasattr(parts.model, "set_requires_gradient_sync"):  # an FSDP2 module
        b = fsdp_rank_bytes(parts.model, optimizer)
    else:
        seen: set[int] = set()
        params = [local(p) for p in parts.params]
        states = [t for st in optimizer.state.values() for t in st.values()]
        return {
            "params": storage_bytes(params, seen),
            "grads": storage_bytes(
                [None if p.grad is None else local(p.grad) for p in parts.params], seen
            ),
            "optimizer": storage_bytes(
                [local(t) for t in states if isinstance(t, torch.Tensor)], seen
            ),
        }
    return {
        "params": int(b.params_bytes),
        "grads": int(b.grads_bytes),
        "optimizer": int(b.optimizer_bytes),
    }
