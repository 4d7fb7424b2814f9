"""What one rank updates, once: each piece of a parameter, its unsplit name, how it is split.

Introduced in notebooks/21_capstone.ipynb (clipping and checkpointing a composed model).

After composition a rank's optimizer updates *pieces*: a whole parameter (replicated by DDP),
rows or columns of one (Megatron's tensor parallelism), a flat padded shard (ZeRO), a DTensor
(FSDP2, DTensor TP), a layer of one pipeline stage. Two things must know which: the global
gradient norm counts every element of the unsplit model once (``clip_grad_norm_``), and a
DCP checkpoint stores every element once and puts it back where it came from
(``checkpoint_state``). Both read the same ``Piece`` list that ``parallelize`` writes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from labkit.parallel.dims import ParallelDims

__all__ = ["Piece", "copies", "local"]


@dataclass(frozen=True)
class Piece:
    """One tensor this rank's optimizer updates.

    Attributes:
        name: the parameter's name in the unsplit model (``"3.attn.q.weight"``); a pipeline
            stage's layers keep their place in the whole model.
        param: the tensor the optimizer updates: a parameter, a ZeRO shard, or a DTensor.
        split: for a plain tensor, ``{axis: tensor dim}`` for every mesh axis this rank holds
            only a part along (``{"tp": 0}`` for a column-parallel weight, ``{"dp": 0}`` for a
            ZeRO shard); a DTensor's ``placements`` say it themselves (leave it empty). The
            pp axis never appears: each stage's pieces have names of their own.
    """

    name: str
    param: torch.Tensor
    split: dict[str, int] = field(default_factory=dict)


def _is_dtensor(t: Any) -> bool:
    return hasattr(t, "placements") and hasattr(t, "to_local")


def local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor this rank stores: a DTensor's local shard, or ``t`` itself."""
    return t.to_local() if _is_dtensor(t) else t


def copies(piece: Piece, dims: ParallelDims) -> int:
    """On how many ranks the very same elements as this rank's piece live.

    A piece replicated along the dp axis (DDP) and along tp (a LayerNorm beside Megatron's
    split layers) lives on dp · tp ranks; a piece split along an axis is unique along it; the
    pp axis never replicates (every stage holds different layers). A DTensor counts the mesh
    dims it is ``Replicate`` on, and the dp and tp axes its mesh does not cover.

    Args:
        piece: the piece.
        dims: the run's degrees.

    Returns:
        The number of copies, ≥ 1: weighing each rank's sum of squares by ``1 / copies`` and
        summing over every rank counts each element of the model once.
    """
    t, n = piece.param, 1
    if _is_dtensor(t):
        names = t.device_mesh.mesh_dim_names or ()
        sizes = t.device_mesh.shape
        n = math.prod(s for s, pl in zip(sizes, t.placements, strict=True) if pl.is_replicate())
        covered = set(names)
    else:
        covered = set(piece.split)
    return n * math.prod(dims.degree(a) for a in ("dp", "tp") if a not in covered)
