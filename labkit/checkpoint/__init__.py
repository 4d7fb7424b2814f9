"""Fault tolerance: atomic checkpoints of the full training state, resume, DCP resharding.

Introduced in notebooks/19_fault_tolerance.ipynb.

    state = lk.checkpoint.TrainState(model, optimizer, scheduler, sampler)
    path = lk.checkpoint.latest(ckpt_dir)                 # newest COMPLETE one, or None
    step = state.load_state_dict(lk.checkpoint.load(path)) if path else 0
    ...
    lk.checkpoint.save(ckpt_dir, state.state_dict(step), step, keep=3)   # every rank

The on-disk layout is documented in ``labkit/checkpoint/store.py`` and the state layout in
``labkit/checkpoint/state.py``.
"""

from __future__ import annotations

from labkit.checkpoint._atomic import (
    FAULT_ENV,
    atomic_torch_save,
    atomic_write_bytes,
    fsync_dir,
)
from labkit.checkpoint.dcp import load_sharded, save_sharded, saved_world_size
from labkit.checkpoint.rng import capture_rng, restore_rng
from labkit.checkpoint.sampler import ResumableSampler
from labkit.checkpoint.state import TrainState
from labkit.checkpoint.store import (
    MARKER,
    checkpoints,
    is_complete,
    latest,
    load,
    prune,
    rank_file,
    save,
    step_dir,
    step_of,
)

__all__ = [
    "FAULT_ENV",
    "MARKER",
    "ResumableSampler",
    "TrainState",
    "atomic_torch_save",
    "atomic_write_bytes",
    "capture_rng",
    "checkpoints",
    "fsync_dir",
    "is_complete",
    "latest",
    "load",
    "load_sharded",
    "prune",
    "rank_file",
    "restore_rng",
    "save",
    "save_sharded",
    "saved_world_size",
    "step_dir",
    "step_of",
]
