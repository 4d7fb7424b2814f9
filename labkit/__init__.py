"""labkit: the lab kit of a hands-on course on distributed training with PyTorch.

Introduced in notebooks/00_setup_and_launcher.ipynb (every notebook starts with
``import labkit as lk``); ``%load_ext labkit`` in tests/notebooks/ranks_magic.ipynb.

``import labkit as lk`` stays light (no torch, matplotlib or papermill until a function
needs them), because every rank imports it too.
"""

from __future__ import annotations

import importlib

from labkit.launcher import (
    BackendSpec,
    LaunchTimeout,
    RankError,
    cpu_lab,
    device_backend,
    fit_ranks,
    get_device,
    gpu_count,
    launch,
    launch_choice,
    rank_context,
    section_gpus,
    shutdown,
    stretch,
)
from labkit.record import record, recorded

__version__ = "0.1.0"

# Submodules loaded on first use: lk.viz, lk.collectives, ...
_LAZY_MODULES = {
    "backends",
    "bench",
    "capstone",
    "checkpoint",
    "collectives",
    "costmodel",
    "course",
    "data",
    "debug",
    "exercises",
    "memory",
    "mesh",
    "models",
    "optim",
    "parallel",
    "planner",
    "precision",
    "preflight",
    "profile",
    "ranks",
    "trace",
    "viz",
    "widgets",
}
_LAZY_ATTRS = {
    "doctor": ("labkit.preflight", "doctor"),
    "check_shared_dir": ("labkit.preflight.cluster", "check_shared_dir"),
    "check_versions": ("labkit.preflight.cluster", "check_versions"),
    "Network": ("labkit.costmodel", "Network"),
    "World": ("labkit.ranks", "World"),
    "language": ("labkit.lang", "language"),
    "set_language": ("labkit.lang", "set_language"),
}

__all__ = [
    "BackendSpec",
    "LaunchTimeout",
    "Network",
    "RankError",
    "World",
    "backends",
    "bench",
    "capstone",
    "check_shared_dir",
    "check_versions",
    "checkpoint",
    "collectives",
    "costmodel",
    "cpu_lab",
    "data",
    "debug",
    "doctor",
    "exercises",
    "device_backend",
    "fit_ranks",
    "get_device",
    "gpu_count",
    "launch_choice",
    "launch",
    "language",
    "memory",
    "mesh",
    "models",
    "optim",
    "parallel",
    "planner",
    "precision",
    "profile",
    "rank_context",
    "ranks",
    "record",
    "recorded",
    "section_gpus",
    "set_language",
    "shutdown",
    "stretch",
    "trace",
    "viz",
    "widgets",
]


def __getattr__(name: str):
    if name in _LAZY_MODULES:
        module = importlib.import_module(f"labkit.{name}")
        globals()[name] = module
        return module
    if name in _LAZY_ATTRS:
        mod, attr = _LAZY_ATTRS[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")


def load_ipython_extension(ip) -> None:
    """``%load_ext labkit``: register the ``%ranks`` / ``%%ranks`` magics (see docs/ranks.md).

    Args:
        ip: the running IPython shell.
    """
    from labkit.ranks.magic import load  # IPython is imported only here

    load(ip)


def unload_ipython_extension(ip) -> None:
    """``%unload_ext labkit``: stop the running world, if any.

    Args:
        ip: the running IPython shell.
    """
    from labkit.ranks.world import current_world

    world = current_world()
    if world is not None:
        world.close()
