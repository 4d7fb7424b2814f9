"""Checkpoint directories: per-rank files, a COMPLETE marker written last, keep the last K.

Introduced in notebooks/19_fault_tolerance.ipynb.

Layout of ``directory`` (``save(directory, state, step=123)`` on 2 ranks)::

    directory/
      step_000123/
        rank_00000.pt      # torch.save(state) of rank 0, written as .tmp, fsynced, renamed
        rank_00001.pt      # rank 1's state
        COMPLETE           # JSON {"step", "world_size", "files"}; written last, by rank 0,
                           # after a barrier: the checkpoint exists only once this file does
      step_000100/ ...     # older complete checkpoints; only the newest ``keep`` are kept

A process killed while saving leaves ``step_000123/`` without ``COMPLETE`` (perhaps with a
``*.tmp`` file): ``latest`` skips it and returns the previous complete checkpoint. This is
the scheme of torchtitan's checkpointer and of Orbax (write, then commit with a marker).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from labkit.checkpoint._atomic import (
    FAULT_ENV,
    atomic_torch_save,
    atomic_write_bytes,
    fault_point,
    fsync_dir,
    inject,
)

MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir(directory: str | os.PathLike, step: int) -> Path:
    """The folder of checkpoint ``step`` inside ``directory`` (``step_000123``)."""
    return Path(directory) / f"step_{step:06d}"


def rank_file(path: str | os.PathLike, rank: int) -> Path:
    """The file of ``rank`` inside checkpoint folder ``path`` (``rank_00001.pt``)."""
    return Path(path) / f"rank_{rank:05d}.pt"


def _dist_info(rank: int | None, group: Any) -> tuple[int, int, bool]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        r = dist.get_rank(group) if rank is None else rank
        return r, dist.get_world_size(group), True
    return (0 if rank is None else rank), 1, False


def save(
    directory: str | os.PathLike,
    state: dict,
    step: int,
    keep: int = 3,
    rank: int | None = None,
    group: Any = None,
    fault: str | None = None,
) -> Path:
    """Save this rank's ``state`` as part of checkpoint ``step``; every rank must call it.

    Each rank writes ``rank_NNNNN.pt`` atomically (tmp, fsync, rename, fsync dir); after a
    barrier rank 0 writes the ``COMPLETE`` marker the same way and deletes all but the newest
    ``keep`` complete checkpoints (and incomplete ones older than the newest complete).
    Outside a process group it is a one-rank save.

    Args:
        directory: the folder holding ``step_*`` checkpoints (created if missing).
        state: this rank's state: tensors and plain data (see ``TrainState.state_dict``).
        step: the training step the state belongs to (after that many optimizer steps).
        keep: how many complete checkpoints to keep (>= 1).
        rank: this rank's number; default ``dist.get_rank(group)`` (0 without a group).
        group: the process group whose ranks save together (None = default group).
        fault: fault injection for the labs, ``"mid_file[:kill|:sleep=S]"`` or
            ``"before_marker[:kill|:sleep=S]"``; default: the ``LABKIT_CHECKPOINT_FAULT``
            environment variable.

    Returns:
        The checkpoint folder ``directory/step_NNNNNN``.

    Raises:
        ValueError: ``keep < 1`` or ``step < 0``.
    """
    import torch.distributed as dist

    if keep < 1 or step < 0:
        raise ValueError(f"need keep >= 1 and step >= 0, got keep={keep}, step={step}")
    fault = os.environ.get(FAULT_ENV) if fault is None else fault
    point = fault_point(fault)
    rank, world_size, distributed = _dist_info(rank, group)
    path = step_dir(directory, step)
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        (path / MARKER).unlink(missing_ok=True)  # re-saving a step: uncommit it first
    if distributed:
        dist.barrier(group=group)  # the folder exists and is uncommitted for everyone
    path.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(rank_file(path, rank), state, fault=fault if point == "mid_file" else None)
    if distributed:
        dist.barrier(group=group)  # every rank's file is in place
    if rank == 0:
        if point == "before_marker":
            inject(fault)
        files = [rank_file(path, r).name for r in range(world_size)]
        meta = {"step": step, "world_size": world_size, "files": files}
        atomic_write_bytes(path / MARKER, json.dumps(meta).encode())
        prune(directory, keep)
    if distributed:
        dist.barrier(group=group)  # nobody runs ahead of the commit
    return path


def is_complete(path: str | os.PathLike) -> bool:
    """Whether checkpoint folder ``path`` has its ``COMPLETE`` marker."""
    return (Path(path) / MARKER).is_file()


def checkpoints(directory: str | os.PathLike, complete_only: bool = True) -> list[Path]:
    """Checkpoint folders in ``directory``, oldest step first.

    Args:
        directory: the folder given to ``save``.
        complete_only: list only folders whose ``COMPLETE`` marker exists.

    Returns:
        The ``step_*`` folders sorted by step.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (is_complete(p) or not complete_only):
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint in ``directory``, or None; incomplete ones are ignored.

    Args:
        directory: the folder given to ``save``.

    Returns:
        The ``step_*`` folder with the highest step that has its marker, or None.
    """
    found = checkpoints(directory)
    return found[-1] if found else None


def step_of(path: str | os.PathLike) -> int:
    """The step number of checkpoint folder ``path`` (``step_000123`` → 123)."""
    m = _STEP_DIR.match(Path(path).name)
    if not m:
        raise ValueError(f"{path} is not a step_NNNNNN checkpoint folder")
    return int(m.group(1))


def load(path: str | os.PathLike, rank: int | None = None, map_location: Any = "cpu") -> dict:
    """Load one rank's state from a complete checkpoint folder.

    Args:
        path: a checkpoint folder (e.g. from ``latest``).
        rank: whose file to read; default this process's rank (0 without a group).
        map_location: passed to ``torch.load``.

    Returns:
        The state dict that rank saved.

    Raises:
        FileNotFoundError: the folder has no ``COMPLETE`` marker, or no file for ``rank``.
    """
    import torch

    path = Path(path)
    if not is_complete(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    rank, _, _ = _dist_info(rank, None)
    f = rank_file(path, rank)
    if not f.is_file():
        meta = json.loads((path / MARKER).read_text())
        raise FileNotFoundError(
            f"{f} missing: checkpoint written by {meta['world_size']} ranks; "
            "resharding to another world size needs the DCP helpers (save_sharded)"
        )
    return torch.load(f, map_location=map_location, weights_only=True)


def prune(directory: str | os.PathLike, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints, and stale incomplete ones.

    An incomplete folder older than the newest complete checkpoint is debris of a killed
    save; a newer incomplete one may still be in progress and is left alone.

    Args:
        directory: the folder given to ``save``.
        keep: how many complete checkpoints to keep.

    Returns:
        The folders removed.
    """
    complete = checkpoints(directory)
    if not complete:
        return []
    newest = step_of(complete[-1])
    doomed = complete[:-keep] if keep < len(complete) else []
    doomed += [
        p
        for p in checkpoints(directory, complete_only=False)
        if not is_complete(p) and step_of(p) < newest
    ]
    for p in doomed:
        # Uncommit first so a crash mid-delete cannot leave a "complete" half-folder.
        (p / MARKER).unlink(missing_ok=True)
        shutil.rmtree(p, ignore_errors=True)
    if doomed:
        fsync_dir(directory)
    return doomed
