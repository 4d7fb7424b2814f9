"""Atomic file writes: write to a temporary name, fsync, rename, fsync the directory.

Introduced in notebooks/19_fault_tolerance.ipynb.

POSIX ``rename(2)`` replaces the target in one step: a reader sees the old file or the new
one, never half of either. The data is durable only after ``fsync`` of the file (its bytes)
and of the directory (the new name); see the Linux ``rename(2)`` and ``fsync(2)`` manual
pages and "Files are hard" (Dan Luu, 2015).
"""

from __future__ import annotations

import io
import os
import signal
import time
from pathlib import Path

# Fault injection for the kill-during-write lab: "point" or "point:action" where point is
# "mid_file" (half of a rank file written to its temporary name) or "before_marker" (every
# rank file in place, marker not yet written) and action is "kill" (SIGKILL this process,
# the default) or "sleep=SECONDS". Read when save() runs, so a rank can set it itself.
FAULT_ENV = "LABKIT_CHECKPOINT_FAULT"
FAULT_POINTS = ("mid_file", "before_marker")


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory's entries (new or renamed names) to disk.

    Args:
        path: the directory.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, fault: str | None = None) -> Path:
    """Write ``data`` to ``path`` so that ``path`` is either absent/old or complete.

    Writes ``<path>.tmp``, fsyncs it, renames it over ``path`` and fsyncs the directory.

    Args:
        path: the final file name.
        data: the bytes to write.
        fault: a fault-injection spec (see ``FAULT_ENV``); only ``"mid_file"`` acts here.

    Returns:
        The final path.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        if fault_point(fault) == "mid_file":
            f.write(data[: len(data) // 2])
            f.flush()
            inject(fault)
        f.write(data[len(data) // 2 :] if fault_point(fault) == "mid_file" else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


def atomic_torch_save(path: str | os.PathLike, obj: object, fault: str | None = None) -> Path:
    """``torch.save`` ``obj`` to ``path`` atomically (see ``atomic_write_bytes``).

    Args:
        path: the final file name.
        obj: what to save (tensors and plain Python data).
        fault: a fault-injection spec (see ``FAULT_ENV``).

    Returns:
        The final path.
    """
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return atomic_write_bytes(path, buf.getvalue(), fault=fault)


def fault_point(fault: str | None) -> str | None:
    """The point named by a fault spec ``"point[:action]"``, or None."""
    if not fault:
        return None
    point = fault.split(":", 1)[0]
    if point not in FAULT_POINTS:
        raise ValueError(f"unknown fault point {point!r}; expected one of {FAULT_POINTS}")
    return point


def inject(fault: str | None) -> None:
    """Carry out a fault spec's action: SIGKILL this process, or sleep.

    Args:
        fault: ``"point"`` or ``"point:kill"`` (SIGKILL) or ``"point:sleep=SECONDS"``.
    """
    action = fault.split(":", 1)[1] if fault and ":" in fault else "kill"
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.startswith("sleep="):
        time.sleep(float(action.split("=", 1)[1]))
    else:
        raise ValueError(f"unknown fault action {action!r}; expected 'kill' or 'sleep=SECONDS'")
