"""The capstone: train a TinyGPT with the strategy a learner picks, and measure it.

Introduced in notebooks/21_capstone.ipynb.

``strategy`` names the parallel degrees (``Strategy``, no torch); ``gpt`` turns one into the
chain of ``labkit.parallel.compose`` calls for a TinyGPT (``parallelize_gpt``); ``config``
holds the sizes and the training recipe (micro-batches, bf16, clipping, warmup + cosine, a
DCP checkpoint); ``train`` runs the loop on every rank and the single-process reference;
``launch`` starts runs from a notebook::

    s = lk.capstone.Strategy.parse("fsdp_tp", world_size=4)
    ranks = lk.capstone.run(s, lk.capstone.RunConfig(steps=5))
    ref = lk.capstone.train_reference(lk.capstone.RunConfig(steps=5))
"""

from __future__ import annotations

import importlib

from labkit.capstone.strategy import NAMES, Strategy

_TORCH = {
    "RunConfig": "config",
    "autocast_context": "config",
    "build_model": "config",
    "global_batch": "config",
    "make_schedule": "config",
    "checkpoint_dir": "train",
    "eval_steps": "train",
    "train_rank": "train",
    "train_reference": "train",
    "train_step": "train",
    "run": "launch",
    "run_jobs": "launch",
    "run_many": "launch",
    "train_many": "launch",
    "dp_flavour": "gpt",
    "gpt_stages": "gpt",
    "gpt_tp_plan": "gpt",
    "lm_loss": "gpt",
    "parallelize_gpt": "gpt",
}

__all__ = ["NAMES", "Strategy", *sorted(_TORCH)]


def __getattr__(name: str):
    if name in _TORCH:
        value = getattr(importlib.import_module(f"labkit.capstone.{_TORCH[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'labkit.capstone' has no attribute {name!r}")
