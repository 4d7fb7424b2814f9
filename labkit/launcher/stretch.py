"""Deadlines that stretch on a loaded machine: ``LABKIT_TIMEOUT_SCALE`` and ``lk.stretch``.

Introduced in notebooks/00_setup_and_launcher.ipynb; set by the workshop room's hub
(docker/room/jupyterhub_config.py) for every learner.

A deadline that is generous for one learner on a laptop can expire on a box that eight learners
share: their ranks wait their turn for the cores, and a 30 s connect becomes a flake. Whoever
knows the load sets ``LABKIT_TIMEOUT_SCALE`` (a room's hub: its learners' CPU share against the
box's cores) and every labkit deadline grows by that factor: ``lk.launch``'s ``timeout`` and the
process-group timeout it gives the ranks, a ``%%ranks`` world's and each cell's. A notebook that
passes a timeout to torch itself writes it as ``lk.stretch(30)``. Unset (or 1): nothing changes.
"""

from __future__ import annotations

import math
import os

ENV = "LABKIT_TIMEOUT_SCALE"

__all__ = ["stretch", "timeout_scale"]


def timeout_scale() -> float:
    """The factor every labkit deadline is multiplied by (``LABKIT_TIMEOUT_SCALE``).

    Returns:
        The variable's value when it is a finite number >= 1, else 1.0 (a smaller value would
        shorten deadlines the lessons rely on).

    Raises:
        ValueError: the variable is set but is not a number.
    """
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return 1.0
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: give a number, e.g. {ENV}=4 on a loaded box") from None
    return scale if math.isfinite(scale) and scale > 1.0 else 1.0


def stretch(seconds: float) -> float:
    """A timeout in seconds, stretched for this machine's load (``LABKIT_TIMEOUT_SCALE``).

    Args:
        seconds: the deadline on an unloaded machine.

    Returns:
        ``seconds * timeout_scale()``.
    """
    return float(seconds) * timeout_scale()
