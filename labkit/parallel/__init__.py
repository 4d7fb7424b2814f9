"""Parallel training techniques, one per module, each taking the process group it acts on.

Introduced in notebooks/06_data_parallel.ipynb (``ddp``); later notebooks add ``async_sgd``,
``model_split``, ``pipeline``, ``tensor``, ``sequence``, ``context``, ``zero``, ``dims`` (the
dp × pp × tp rank grid), ``compose`` (the ``apply_*`` chain that combines them, notebook
18) and ``moe`` (mixture of experts and expert parallelism). Import the submodule you need,
e.g. ``from labkit.parallel import ddp`` or ``lk.parallel.ddp`` (loaded on first use).
"""

from __future__ import annotations

import importlib

_SUBMODULES = frozenset(
    "accumulate async_sgd compose context ddp dims model_split moe pipeline sequence tensor "
    "zero".split()
)


def __getattr__(name: str):
    if name in _SUBMODULES:
        module = importlib.import_module(f"labkit.parallel.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'labkit.parallel' has no attribute {name!r}")
