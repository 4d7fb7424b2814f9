"""The capstone: train a TinyGPT with the strategy a learner picks, and measure it.

Introduced in notebooks/17_capstone.ipynb.

``strategy`` names the parallel degrees (``Strategy``, no torch), ``build`` (with ``setups``
and ``sharded``) builds one rank's share of the model with the course's techniques (DDP,
ZeRO-1/2/3, FSDP2, tensor and pipeline parallelism), ``train`` runs the steps on every rank and the
single-process reference::

    s = lk.capstone.Strategy.parse("zero3", world_size=4)
    ranks = lk.capstone.run(s, lk.capstone.RunConfig(steps=5))
    ref = lk.capstone.train_reference(lk.capstone.RunConfig(steps=5))
"""

from __future__ import annotations

import importlib

from labkit.capstone.strategy import NAMES, Strategy

_TORCH = {
    "RunConfig": "train",
    "build_model": "train",
    "global_batch": "train",
    "run": "train",
    "run_many": "train",
    "train_many": "train",
    "train_rank": "train",
    "train_reference": "train",
    "gpt_stages": "setups",
    "lm_loss": "setups",
    "make_groups": "setups",
    "make_setup": "build",
}

__all__ = ["NAMES", "Strategy", *sorted(_TORCH)]


def __getattr__(name: str):
    if name in _TORCH:
        value = getattr(importlib.import_module(f"labkit.capstone.{_TORCH[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'labkit.capstone' has no attribute {name!r}")
