"""Capture and restore every random number generator a training step may draw from.

Introduced in notebooks/19_fault_tolerance.ipynb.

A resumed run is bit-identical to an uninterrupted one only if dropout masks, shuffles and
augmentations draw the same numbers, so each rank saves the state of torch's CPU (and CUDA)
generator, numpy's global generator and Python's ``random``. The result is plain data and
tensors, loadable with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any


def capture_rng() -> dict[str, Any]:
    """This process's RNG states: torch (CPU and each CUDA device), numpy, Python ``random``.

    Returns:
        ``{"torch": ByteTensor, "cuda": [ByteTensor, ...], "numpy": {...} | None,
        "python": tuple}``; numpy's state is stored as plain data (``kind``, ``keys``,
        ``pos``, ``has_gauss``, ``cached_gaussian``), None without numpy.
    """
    import torch

    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "python": random.getstate(),
        "numpy": None,
    }
    try:
        import numpy as np
    except ImportError:
        return state
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state["numpy"] = {
        "kind": str(kind),
        "keys": torch.from_numpy(keys.astype("int64")),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(gauss),
    }
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set this process's RNGs to a state from ``capture_rng``.

    Args:
        state: what ``capture_rng`` returned (possibly after a save/load round trip).
    """
    import torch

    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    py = state["python"]
    # torch.load gives lists where pickle gave tuples; random.setstate wants tuples.
    random.setstate((py[0], tuple(py[1]), py[2]))
    if state.get("numpy") is not None:
        import numpy as np

        n = state["numpy"]
        keys = n["keys"].numpy().astype("uint32")
        np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
