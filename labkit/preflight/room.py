"""The doctor's line for a learner in a workshop room: what the room's hub gave this server.

Introduced in notebooks/00_setup_and_launcher.ipynb (``lk.doctor()``); the hub side is
docker/room/jupyterhub_config.py with :mod:`labkit.room`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from labkit.preflight.checks import Check
from labkit.room import ENV_GPUS, ENV_LEARNER, ENV_NOTE


def check_room_seat(usable_gpus: int, environ: Mapping[str, str] | None = None) -> Check | None:
    """Say which GPUs the room gave this learner, and whether this server sees them.

    Args:
        usable_gpus: GPUs torch can use here (the doctor's count).
        environ: the environment (``os.environ`` when None).

    Returns:
        None outside a room (no ``LABKIT_ROOM_LEARNER``); else "ok" with the seat, "warn" for a
        CPU-only seat in a room that has GPUs, and "warn" when this server does not see the
        GPUs it was given (the labs still run, on the CPU: nothing blocks the course).
    """
    env = os.environ if environ is None else environ
    learner = env.get(ENV_LEARNER)
    if not learner:
        return None
    gpus = [g for g in env.get(ENV_GPUS, "").split(",") if g]
    note = env.get(ENV_NOTE, "")
    detail = f"learner {learner}: {note}" if note else f"learner {learner}"
    if not gpus:
        if "no GPU left" in note:
            fix = (
                "nothing to do for the course: every lab runs on CPU ranks; ask the instructor "
                "if you need a GPU section"
            )
            return Check("room seat", "warn", detail, fix)
        return Check("room seat", "ok", detail)
    if usable_gpus < len(gpus):
        return Check(
            "room seat",
            "warn",
            f"{detail}; but this server can use {usable_gpus} GPU(s)",
            "ask the instructor: the server was started without its GPUs (see 'torch cuda')",
        )
    return Check("room seat", "ok", f"{detail} (seen here as cuda:0..{len(gpus) - 1})")
