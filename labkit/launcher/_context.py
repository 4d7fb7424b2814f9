"""Per-rank facts that the launcher resolved, readable from code running inside a rank.

Introduced in notebooks/00_setup_and_launcher.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    device: Any  # torch.device, typed loosely so this module imports without torch
    backend: str


_current: RankContext | None = None


def set_rank_context(rank: int, world_size: int, device: Any, backend: str) -> None:
    global _current
    _current = RankContext(rank, world_size, device, backend)


def rank_context() -> RankContext:
    """The context of the rank this code runs in.

    Raises:
        RuntimeError: outside a rank started by ``lk.launch``.
    """
    if _current is None:
        raise RuntimeError(
            "not inside a rank: call this from a function run by lk.launch(fn, world_size=...)"
        )
    return _current


def get_device():
    """The ``torch.device`` that ``lk.launch`` resolved for this rank (``cuda:<rank>`` or cpu).

    Returns:
        torch.device: where this rank should put its tensors.

    Raises:
        RuntimeError: when called outside a rank started by ``lk.launch``.
    """
    return rank_context().device


def device_backend(group=None, device=None) -> str:
    """The backend that carries tensors on ``device`` in ``group``: its name for that device.

    Under the launcher's "auto" rule a group on GPUs is ``"cpu:gloo,cuda:nccl"``: CUDA
    tensors go over NCCL and CPU tensors over gloo, so "which backend?" has an answer only
    per device type. ``torch.distributed.get_backend`` returns the whole string.

    Args:
        group: the process group (None: the default group).
        device: the tensors' device (None: ``get_device()``, this rank's device).

    Returns:
        e.g. ``"nccl"``, ``"gloo"``, ``"labkit_shm"``.

    Raises:
        RuntimeError: no default group, or ``device`` None outside a launched rank.
        ValueError: the group has no backend for that device type.
    """
    import torch
    import torch.distributed as dist

    kind = torch.device(device if device is not None else get_device()).type
    return backend_for(str(dist.get_backend(group)), kind)


def backend_for(backend: str, device_type: str) -> str:
    """The part of a backend string that serves ``device_type`` (``"cpu:gloo,cuda:nccl"``).

    Args:
        backend: a backend as ``init_process_group`` takes it.
        device_type: ``"cpu"``, ``"cuda"``, ...

    Returns:
        The backend for that device type (the whole string when it names one backend).

    Raises:
        ValueError: a multi-device string without that device type.
    """
    if ":" not in backend:
        return backend
    parts = dict(p.split(":", 1) for p in backend.split(","))
    if device_type not in parts:
        raise ValueError(f"backend {backend!r} has no backend for {device_type} tensors")
    return parts[device_type]
