"""What each launch resolved ``"auto"`` to: the backend, device and world size its ranks used.

Introduced in notebooks/00_setup_and_launcher.ipynb (``labkit course run`` reports it).

Every ``lk.launch`` (and every ``%%ranks`` world) notes its resolved plan here, in the process
that launches (the notebook's kernel). When ``LABKIT_LAUNCH_LOG`` names a file, each launch is
also appended to it as one JSON line; the course runner sets it for the kernel it starts and
reads the file back, so the report shows what the ranks ran on, not only the parameters passed.
Nothing is displayed, so no notebook output changes.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

LAUNCH_LOG_ENV = "LABKIT_LAUNCH_LOG"


@dataclass(frozen=True)
class Launch:
    """One launch as its ranks ran it: backend name, device type (``cpu`` or ``cuda``), ranks."""

    backend: str
    device: str
    world_size: int


_launches: list[Launch] = []


def note_launch(backend: str, device: str, world_size: int) -> Launch:
    """Note one launch's resolved plan (and append it to ``$LABKIT_LAUNCH_LOG`` if set).

    Args:
        backend: the backend the ranks initialise (``"gloo"``, ``"nccl"``, ``"labkit_shm"``...).
        device: the plan's device, ``"cpu"`` or ``"cuda:{rank}"`` (rank r on GPU r).
        world_size: number of ranks.

    Returns:
        The :class:`Launch` noted; its ``device`` is the device type.
    """
    entry = Launch(backend, device.split(":", 1)[0], int(world_size))
    _launches.append(entry)
    path = os.environ.get(LAUNCH_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(asdict(entry)) + "\n")
    return entry


def launches() -> list[Launch]:
    """Every launch noted in this process so far, in order (a copy)."""
    return list(_launches)


def read_launch_log(path: str | Path) -> list[Launch]:
    """Read a ``LABKIT_LAUNCH_LOG`` file back.

    Args:
        path: the file; a missing file means no launch happened.

    Returns:
        The launches, in order.
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Launch(**json.loads(line)) for line in lines if line.strip()]
