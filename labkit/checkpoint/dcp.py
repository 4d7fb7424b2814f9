"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP), committed by a marker.

Introduced in notebooks/19_fault_tolerance.ipynb.

DCP writes one ``__<rank>_0.distcp`` file per rank plus a ``.metadata`` file that says which
slice of which global tensor every stored chunk holds. Loading plans reads against that
metadata, so a state sharded over 4 ranks loads into DTensors sharded over 2 (or 1, or 8):
each rank reads the chunks overlapping its own shard (PyTorch docs, "Distributed
Checkpoint - torch.distributed.checkpoint"; torchtitan's checkpointer). We wrap it in the
same ``step_NNNNNN/`` + ``COMPLETE`` scheme as ``save`` so ``latest`` works for both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from labkit.checkpoint._atomic import atomic_write_bytes
from labkit.checkpoint.store import MARKER, is_complete, prune, step_dir


def save_sharded(
    directory: str | os.PathLike, state: dict, step: int, keep: int = 3, group: Any = None
) -> Path:
    """Save a (DTensor-)sharded ``state`` with DCP into ``directory/step_NNNNNN``.

    Every rank of ``group`` calls it with its own shards; rank 0 writes ``COMPLETE`` after a
    barrier and prunes to the newest ``keep`` checkpoints.

    Args:
        directory: the folder holding ``step_*`` checkpoints.
        state: a state dict of DTensors, tensors and plain data (e.g. from
            ``torch.distributed.checkpoint.state_dict.get_state_dict`` of an FSDP2 model).
        step: the training step.
        keep: complete checkpoints to keep.
        group: the process group that saves together (None = default group).

    Returns:
        The checkpoint folder.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank(group)
    path = step_dir(directory, step)
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        (path / MARKER).unlink(missing_ok=True)
    dist.barrier(group=group)
    dcp.save(state, checkpoint_id=str(path), process_group=group)
    dist.barrier(group=group)
    if rank == 0:
        meta = {"step": step, "world_size": dist.get_world_size(group), "format": "dcp"}
        atomic_write_bytes(path / MARKER, json.dumps(meta).encode())
        prune(directory, keep)
    dist.barrier(group=group)
    return path


def load_sharded(path: str | os.PathLike, state: dict, group: Any = None) -> dict:
    """Load a DCP checkpoint into ``state`` in place, resharding to ``state``'s layout.

    ``state`` holds DTensors (or tensors) of the right global shapes laid out the way this
    run wants them; the saving run's world size does not matter.

    Args:
        path: a complete checkpoint folder written by ``save_sharded``.
        state: the state dict to fill (tensors are filled in place; plain values replaced).
        group: the process group that loads together (None = default group).

    Returns:
        ``state``, filled.

    Raises:
        FileNotFoundError: ``path`` has no ``COMPLETE`` marker.
    """
    import torch.distributed.checkpoint as dcp

    if not is_complete(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    dcp.load(state, checkpoint_id=str(path), process_group=group)
    return state


def saved_world_size(path: str | os.PathLike) -> int:
    """How many ranks wrote checkpoint folder ``path`` (from its ``COMPLETE`` marker)."""
    return int(json.loads((Path(path) / MARKER).read_text())["world_size"])
